"""lenpred inside vLLM: the serving model's own prefill (and decode) states read in the engine, the predictor's head
applied in the scheduler, and length-aware parked policies — no second forward pass.

* :mod:`.capture`: which rows of a step to keep and the forward hooks that keep them (engine-independent).
* :mod:`.worker`: ``--worker-cls lenpred.serving.vllm.worker.LenpredCPUWorker`` (GPU: ``LenpredGPUWorker``).
* :mod:`.scheduler`: ``--scheduler-cls lenpred.serving.vllm.scheduler.LenpredScheduler``.
* :mod:`.config`: the settings, ``--additional-config '{"lenpred": {...}}'``.

vLLM resolves both classes by their qualified names, so no entry point is registered: a ``vllm.general_plugins``
entry point would import lenpred (and torch-side setup) into every vLLM process of every environment that installs
the extra, also where the plug-in is not used. The decisions themselves live in :mod:`lenpred.serving.parked`.
"""
