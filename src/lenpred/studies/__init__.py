"""Studies: each a config + ``run(cfg)`` returning a report dict, written under ``results/`` by the CLI."""
