"""Learning while serving, below the pipeline: the online PLP state of a running request (progressive), the
traffic log, online-adaptive intervals, refits on logged traffic, and OnlineLearning (what a serving path calls)."""
