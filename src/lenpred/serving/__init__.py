"""Serving: length-aware decisions and the engine integrations that make them (the vLLM plug-in in ``serving.vllm``)."""
