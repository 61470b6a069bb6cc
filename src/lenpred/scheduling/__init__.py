"""Length-aware scheduling: workloads with predictions (:mod:`.workload`), policies (:mod:`.policies`), a
discrete-event simulator (:mod:`.simulator`) driven by a measured cost model (:mod:`.cost_model`), real-engine runs
(:mod:`.static_run`) and the report (:mod:`.report`)."""
