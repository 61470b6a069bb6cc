"""Serving-side pieces: the traffic log, online-adaptive intervals, and (later) policies, simulator and proxies."""
