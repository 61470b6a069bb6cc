"""lenpred.studies.diagnose: hand-worked values for the pure functions, the pruned-entropy option of extract_signals on a
tiny model, and `lenpred diagnose` end to end on a tiny benchmark."""

import json
import math

import numpy as np
import pytest
import torch

from lenpred.studies.diagnose.ablation import candidate
from lenpred.studies.diagnose.attribution import correlations
from lenpred.studies.diagnose.entropy import entropy_agreement, frequent_vocabulary, pruned_entropy, with_entropy
from lenpred.studies.diagnose.misalignment import (TokenWeightTally, bottom_half, misalignment_shares, top_fraction,
                                              top_token_share, within_prompt_percentile)
from lenpred.studies.diagnose.overhead import breakdown
from lenpred.errors import LenpredError
from lenpred.signals import PromptSignals, token_entropy_from_logits


def test_top_fraction_and_bottom_half_by_hand():
    v = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.2])
    assert top_fraction(v, 0.4).tolist() == [False, True, False, True, False]  # ceil(0.4 * 5) = 2 largest
    assert bottom_half(v).tolist() == [True, False, False, False, True]  # floor(5 / 2) = 2 smallest
    assert top_fraction(torch.tensor([1.0, 1.0, 1.0]), 0.33).tolist() == [True, False, False]  # ties: earliest
    with pytest.raises(LenpredError):
        top_fraction(v, 0.0)


def test_misalignment_shares_on_five_tokens():
    # anti-aligned: the 2 highest-entropy tokens are the 2 lowest by semantic score, and vice versa
    H, S = torch.tensor([5.0, 4, 3, 2, 1]), torch.tensor([1.0, 2, 3, 4, 5])
    assert misalignment_shares(H, S) == {"high_entropy_low_semantic": 1.0, "high_semantic_low_entropy": 1.0,
                                         "chance": 0.4}
    # top-2 entropy {1, 3}, bottom-2 semantic {1, 0}: 1 of 2; top-2 semantic {4, 3}, bottom-2 entropy {0, 4}: 1 of 2
    H, S = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.2]), torch.tensor([0.3, 0.1, 0.6, 0.8, 0.9])
    shares = misalignment_shares(H, S)
    assert shares["high_entropy_low_semantic"] == 0.5 and shares["high_semantic_low_entropy"] == 0.5
    assert misalignment_shares(H, H)["high_entropy_low_semantic"] == 0.0  # a ranking agrees with itself
    with pytest.raises(LenpredError):
        misalignment_shares(H, S[:4])


def test_percentile_and_top_share():
    assert within_prompt_percentile(torch.tensor([3.0, 1.0, 2.0])).tolist() == [1.0, 0.0, 0.5]
    assert within_prompt_percentile(torch.tensor([7.0])).tolist() == [0.5]
    assert top_token_share(torch.tensor([1.0, 3.0])) == 0.75


def test_token_weight_tally():
    t = TokenWeightTally()
    t.add(["a", "b"], torch.tensor([0.75, 0.25]), torch.tensor([0.5, 0.5]))
    t.add(["a", "c"], torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75]))
    tab = t.table(top=3, min_count=1)
    # a: (+0.25 + 0.25) / 2 prompts; b: -0.25 / 2; c: -0.25 / 2
    assert tab["over"][0] == {"token": "a", "mass_per_prompt": 0.25, "count": 2}
    assert {r["token"] for r in tab["under"][:2]} == {"b", "c"} and tab["under"][0]["mass_per_prompt"] == -0.125
    assert t.table(min_count=2)["over"] == [{"token": "a", "mass_per_prompt": 0.25, "count": 2}]
    with pytest.raises(LenpredError):
        t.add(["a"], torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.5]))


def test_correlations_by_hand():
    r = correlations(np.array([1, 2, 3, 4]), np.array([1, 3, 2, 4]))
    # deviations (-1.5, -.5, .5, 1.5) and (-1.5, .5, -.5, 1.5): cov 4 / sqrt(5 * 5) = 0.8; ranks equal values
    assert r["pearson"] == pytest.approx(0.8) and r["spearman"] == pytest.approx(0.8) and r["n"] == 4
    assert correlations(np.ones(4), np.arange(4))["pearson"] is None
    with pytest.raises(LenpredError):
        correlations(np.arange(3), np.arange(4))


def test_pruned_entropy():
    g = torch.Generator().manual_seed(0)
    h, W = torch.randn(7, 5, generator=g), torch.randn(11, 5, generator=g)
    full = token_entropy_from_logits(h @ W.T)
    assert torch.allclose(pruned_entropy(h, W), full, atol=1e-6)
    assert torch.allclose(pruned_entropy(h, W, torch.arange(11), chunk=3), full, atol=1e-6)  # k = vocab
    # a zero state gives equal logits: the entropy of k equally likely tokens is log k
    assert pruned_entropy(torch.zeros(1, 5), W, torch.tensor([0, 2, 4, 6]))[0] == pytest.approx(math.log(4))
    sub = torch.tensor([1, 3])
    assert torch.allclose(pruned_entropy(h, W, sub), token_entropy_from_logits(h @ W[sub].T), atol=1e-6)
    with pytest.raises(LenpredError):
        pruned_entropy(h, W, torch.tensor([11]))
    a = entropy_agreement(np.array([1.0, 2, 3]), np.array([1.0, 2, 3]))
    assert a["pearson"] == pytest.approx(1) and a["mean_abs_diff"] == 0


def test_frequent_vocabulary_by_hand():
    lists = [[1, 1, 2], [2, 2, 3]]  # counts: 2 -> 3, 1 -> 2, 3 -> 1
    assert frequent_vocabulary(lists, 2, 10).tolist() == [1, 2]
    assert frequent_vocabulary(lists, 4, 10).tolist() == [0, 1, 2, 3]  # padded with the smallest unseen id
    with pytest.raises(LenpredError):
        frequent_vocabulary(lists, 11, 10)


def test_with_entropy_replaces_only_entropy():
    s = PromptSignals(torch.zeros(1, 3, 2), torch.ones(3), torch.ones(3), (1,))
    r = with_entropy(s, torch.tensor([1.0, 2, 3]))
    assert r.token_entropy.tolist() == [1, 2, 3] and s.token_entropy.tolist() == [1, 1, 1]
    assert r.hidden_states is s.hidden_states
    with pytest.raises(LenpredError):
        with_entropy(s, torch.ones(2))


def test_extract_signals_pruned_vocabulary(tiny_backbone, one_torch_thread):
    from lenpred.signals import extract_signals

    ids = [[1, 5, 7, 9, 4], [3, 2, 8]]
    L = tiny_backbone.num_layers
    full = extract_signals(tiny_backbone, ids, (L,))
    V = tiny_backbone.model.get_output_embeddings().weight.shape[0]
    same = extract_signals(tiny_backbone, ids, (L,), entropy_vocab=torch.arange(V))
    vocab = torch.tensor([0, 2, 3, 7])
    pruned = extract_signals(tiny_backbone, ids, (L,), entropy_vocab=vocab)
    W = tiny_backbone.model.get_output_embeddings().weight.detach()
    for f, s, p in zip(full, same, pruned):
        assert torch.allclose(f.token_entropy, s.token_entropy, atol=1e-5)
        # offline (from the returned final states) == online pruned head; cached final state reproduces full entropy
        assert torch.allclose(pruned_entropy(f.layer(L), W, vocab), p.token_entropy, atol=1e-5)
        assert torch.allclose(pruned_entropy(f.layer(L), W), f.token_entropy, atol=1e-5)
        assert (p.token_entropy <= math.log(4) + 1e-5).all()
    with pytest.raises(LenpredError):
        extract_signals(tiny_backbone, ids, (L,), entropy_vocab=torch.tensor([V]))


def test_ablation_candidate():
    settings = {"pool_span": "after_prefix", "semantic_divisor": "n", "head": {"epochs": 3}}
    assert candidate(0.0, 2.0, 5, settings)[0] == "entropy_only"
    assert candidate(math.inf, 1.0, 5, settings)[0] == "semantic_only"
    method, params = candidate(0.5, 1.0, 5, settings, {"tau": 2.0})
    assert method == "estp" and params["lambda1"] == 0.5 and params["lambda2"] == 1.0 and params["layer"] == 5
    assert params["head"] == {"epochs": 3, "tau": 2.0}


def test_overhead_breakdown_by_hand():
    case = {"variants": {"plain": {"seconds": 1.0}, "entropy_full": {"seconds": 1.3},
                         "signals_full": {"seconds": 1.4}, "entropy_pruned": {"seconds": 1.05}},
            "pool_head_s": {"estp": 0.01}}
    b = breakdown(case)
    assert b["lm_head_entropy"]["share_of_plain"] == pytest.approx(0.3)
    assert b["last_layer_eager_attention"]["seconds"] == pytest.approx(0.1)
    assert b["pruned_lm_head_entropy"]["seconds"] == pytest.approx(0.05)
    assert b["pool_head_estp"]["share_of_plain"] == pytest.approx(0.01)


def test_diagnose_end_to_end_on_tiny_model(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, one_torch_thread):
    from typer.testing import CliRunner

    from lenpred.cli import app

    runner = CliRunner()
    monkeypatch.setenv("LENPRED_CACHE", str(tmp_path / "lenpred-cache"))
    bench, ev, out = tmp_path / "bench", tmp_path / "ev", tmp_path / "diag"
    common = ["--model", str(tiny_model_dir), "--bench", str(bench), "--data-dir", str(tiny_data_dir), "--cache",
              str(tmp_path / "cache")]
    assert runner.invoke(app, ["bench", "build", "--out", str(bench), "--preset", "tiny", "--model",
                               str(tiny_model_dir), "--engine", "transformers", "--data-dir", str(tiny_data_dir),
                               "--seed", "5"]).exit_code == 0
    r = runner.invoke(app, ["evaluate", *common, "--out", str(ev), "--layers", "1,-1", "--epochs", "2", "--seeds", "0",
                            "--methods", "mean,entropy_only,semantic_only,egtp,estp"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["diagnose", *common, "--evaluate", str(ev), "--out", str(out), "--attribution-prompts", "1",
                            "--pruned-ks", "8", "--overhead-k", "8", "--seeds", "0,1", "--max-batch-tokens", "32",
                            "--overhead-repeats", "1", "--overhead-batch-sizes", "1,2", "--overhead-lengths", "16,32"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "diagnose.json").read_text())
    assert set(report) == {"misalignment", "attribution", "ablation", "entropy", "overhead"}
    assert report["entropy"]["verification"]["max_abs_diff"] < 1e-4  # cached final state reproduces the entropy
    assert report["entropy"]["variants"]["top8"]["k"] == 8
    grid = [r for r in report["ablation"]["rows"] if r["group"] == "grid"]
    assert len(grid) == 7 * 4
    head = report["ablation"]["headline"]  # each headline row is its kind's best grid point on validation
    ratio = lambda r: math.inf if r["ratio"] is None else r["ratio"]  # noqa: E731  (JSON writes inf as null)
    for kind, keep in (("entropy_only", lambda r: r == 0), ("semantic_only", math.isinf),
                       ("joint", lambda r: 0 < r < math.inf)):
        assert head[kind]["val_mae"] == min(r["val_mae"] for r in grid if keep(ratio(r)))
        assert head[kind]["test_mae"] == pytest.approx(np.mean(head[kind]["test_mae_seeds"]))  # seeds 0, 1 averaged
    # the paired difference's point estimate is the difference of the seed-averaged test MAEs
    assert head["joint"]["diff_entropy_only"][0] == pytest.approx(head["joint"]["test_mae"]
                                                                  - head["entropy_only"]["test_mae"])
    assert head["entropy_only"]["diff_entropy_only"] is None
    o = report["overhead"]
    assert [(c["batch_size"], c["prompt_tokens"]) for c in o["cases"]] == [(1, 16), (1, 32), (2, 16)]
    assert o["skipped"] == [{"batch_size": 2, "prompt_tokens": 32}]  # 64 tokens > --max-batch-tokens 32
    assert o["cases"][0]["ratio"]["plain"] == 1.0
    shares = report["misalignment"]["stats"]["high_entropy_low_semantic"]["overall"]
    assert 0 <= shares["mean"] <= 1
    md = (out / "REPORT.md").read_text()
    for heading in ("## Misalignment", "## Attribution", "## Ablations", "## Cheaper entropy", "## Overhead",
                    "## Closing note"):
        assert heading in md
    for png in ("misalignment.png", "ablation.png", "overhead.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # re-render only (no section computed): same sections, report rewritten
    r = runner.invoke(app, ["diagnose", "--evaluate", str(ev), "--out", str(out), "--sections", ""])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["diagnose", "--evaluate", str(ev), "--out", str(out), "--sections", "bogus"])
    assert r.exit_code == 2 and "unknown sections" in r.stderr
