"""``lenpred serve``: the OpenAI-compatible HTTP proxy (app), its prediction batcher and its Prometheus metrics."""
