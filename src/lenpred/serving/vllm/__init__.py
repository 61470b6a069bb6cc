"""lenpred inside vLLM: the serving model's own prefill (and decode) states read in the engine, the predictor's head
applied in the scheduler, and length-aware parked policies — no second forward pass.

* :mod:`.capture`: which rows of a step to keep and the forward hooks that keep them (pure torch, engine-independent).
* :mod:`.worker`: the worker process's vLLM adapter, ``--worker-cls lenpred.serving.vllm.worker.LenpredCPUWorker``
  (GPU: ``LenpredGPUWorker``).
* :mod:`.scheduler`: the scheduler process's vLLM adapter, ``--scheduler-cls
  lenpred.serving.vllm.scheduler.LenpredScheduler``.
* :mod:`.contract`: what the two agree on without importing vLLM or each other (the states' attribute, the vLLM
  versions written for, the start-up checks).
* :mod:`.config`: the settings, ``--additional-config '{"lenpred": {...}}'``; :mod:`.prometheus`: the counters in
  ``/metrics``.

vLLM's internals are named in :mod:`.worker` and :mod:`.scheduler` only, each checked against the installed vLLM at
start-up.

vLLM resolves both classes by their qualified names, so no entry point is registered: a ``vllm.general_plugins``
entry point would import lenpred (and torch-side setup) into every vLLM process of every environment that installs
the extra, also where the plug-in is not used. The decisions themselves live in :mod:`lenpred.serving.parked`.
"""
