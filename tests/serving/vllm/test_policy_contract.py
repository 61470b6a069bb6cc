"""The policy contract suite: every registered policy, run by both executors of parked decoding — the simulator
(:class:`lenpred.serving.simulator._Parked`) and the vLLM plug-in's scheduler on a fake engine (vLLM's real V1
scheduler, no weights: :mod:`.fake_engine`) — on the same small trace, makes the same decisions: the same decode set
after every change, and the same finish order.

The trace: six requests arrive together; each one's ``priority`` is its predicted length (``rank_by: priority``, so
both executors rank by the same numbers), its ``max_tokens`` its output length; 2 decode slots and a window of 2
(4 admitted at once), shortest prompt first into the window (``admit_by: prompt_len``). A policy registered later
(in a test) runs through the same suite: adding a policy is one class.
"""

import pytest

pytest.importorskip("vllm")
from lenpred.serving.cost_model import CostModel  # noqa: E402
from lenpred.serving.parked import SchedulerConfig  # noqa: E402
from lenpred.serving.policies import POLICIES  # noqa: E402
from lenpred.serving.simulator import SimConfig, _Parked  # noqa: E402
from lenpred.studies.workload import WorkloadRequest  # noqa: E402

from .fake_engine import CHUNK, make_scheduler, request, step  # noqa: E402

pytestmark = [pytest.mark.vllm]

PROMPT_TOKENS = (20, 12, 16, 14, 10, 8)
PREDICTED = (50, 10, 40, 20, 5, 30)  # tokens, sent as each request's priority
OUTPUT_TOKENS = (30, 3, 20, 18, 2, 40)  # long enough for LAS to demote (its first quantum: 16 tokens)
DECODE_SLOTS, WINDOW = 2, 2
FAST = CostModel("1 ms per forward", {"p0": 1e-3, "p1": 0.0, "p2": 0.0, "d0": 1e-3, "d1": 0.0, "d2": 0.0},
                 fused_prefill=True)  # waits stay ~ms in both executors, so HRRN's waited work is negligible in both


@pytest.fixture(scope="module")
def model_dir():
    from lenpred.backbone import resolve_model

    return resolve_model()[0]


def settings(policy: str) -> dict:
    return {"policy": policy, "decode_slots": DECODE_SLOTS, "prefill_ahead": WINDOW, "admit_by": "prompt_len",
            "max_idle_s": None}


def collapse(decisions) -> list[tuple]:
    """Decode sets (as sorted tuples) with empty ones and consecutive repeats dropped."""
    out = []
    for d in decisions:
        d = tuple(sorted(d))
        if d and (not out or out[-1] != d):
            out.append(d)
    return out


def simulated(policy: str) -> tuple[list[tuple], list[str]]:
    """The simulator's decode sets and finish order on the trace."""
    reqs = [WorkloadRequest(i, [], n, 64, "longseq", f"p{i}", {"sent": float(p)}, num_prompt_tokens=t)
            for i, (t, p, n) in enumerate(zip(PROMPT_TOKENS, PREDICTED, OUTPUT_TOKENS))]
    config = SchedulerConfig(**settings(policy))
    predictor = "sent" if POLICIES[policy].reads_prediction else None
    run = _Parked(reqs, config, config.make_policy(predictor), FAST,
                  SimConfig(max_num_seqs=8, max_num_batched_tokens=CHUNK))
    _, timings = run.run()
    finish = [str(t.request_id) for t in sorted(timings, key=lambda t: (t.finish_time_s, t.request_id))]
    return collapse(run.decisions), finish


def served(model_dir, policy: str) -> tuple[list[tuple], list[str]]:
    """The plug-in's decode sets (prefilled requests scheduled a token, per step) and finish order on the trace."""
    s, worker, _ = make_scheduler(model_dir, scheduling_policy="priority", rank_by="priority", **settings(policy))
    for i, (t, p, n) in enumerate(zip(PROMPT_TOKENS, PREDICTED, OUTPUT_TOKENS)):
        s.add_request(request(str(i), prompt_len=t, max_tokens=n, priority=p, first=100 + 40 * i))
    decisions, finish = [], []
    for _ in range(200):
        if not s.requests:
            break
        prefilled = {rid for rid, r in s.lenpred_requests.items() if r.prefilled}
        so, done = step(s, worker)
        decisions.append([rid for rid in so.num_scheduled_tokens if rid in prefilled])
        finish += sorted(done, key=int)
    return collapse(decisions), finish


def test_the_trace_makes_policies_disagree():
    """The suite is only as strong as its trace: policies must decide differently on it. The window takes the four
    shortest prompts (5: 8 tokens, 4: 10, 1: 12, 3: 14); fcfs decodes the two first arrivals of them (1, 3), sjf the
    two shortest predictions (4: 5 tokens, 1: 10), hrrn the two shortest prompts (5, 4). LAS demotes a request after
    16 tokens, so its slots change hands mid-request (more decisions than requests)."""
    runs = {p: simulated(p) for p in ("fcfs", "sjf", "hrrn", "las")}
    assert {p: runs[p][0][0] for p in ("fcfs", "sjf", "hrrn")} == {"fcfs": ("1", "3"), "sjf": ("1", "4"),
                                                                  "hrrn": ("4", "5")}
    assert len({tuple(d) for d, _ in runs.values()}) == 4 and len(runs["las"][0]) > len(OUTPUT_TOKENS)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_registered_policy_decides_alike_in_the_simulator_and_the_engine(model_dir, policy):
    sim_decisions, sim_finish = simulated(policy)
    engine_decisions, engine_finish = served(model_dir, policy)
    assert engine_decisions == sim_decisions
    assert engine_finish == sim_finish and sorted(sim_finish, key=int) == [str(i) for i in range(6)]
