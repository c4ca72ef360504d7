"""Grammar compilation cannot take the process down (issue #46): static bounds refuse deep,
big and large schemas before llguidance sees them; a schema that crashes llguidance kills a
compile worker process, not this one; dead or hung workers are replaced; verdicts are cached;
a parser row over llguidance's limit is refused at compile time, or ends its own request
when generation meets it."""

import os
import signal
import time

import pytest

from graft.errors import GraftConfigError
from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.engine.grammar_check import GrammarLimitError, SchemaLimits, ref_depth
from graft.serving.engine.grammar_worker import CompileLimits, GrammarCompiler
from tests.serving.schema_shapes import LATE_WIDE, ref_chain, wide_object

UNBOUNDED = SchemaLimits(max_bytes=1 << 30, max_nodes=1 << 30, max_depth=1 << 30)


@pytest.fixture
def unbounded():
    """A compiler without static bounds: every schema reaches a worker process."""
    compiler = GrammarCompiler(CompileLimits(schema=UNBOUNDED))
    yield compiler
    compiler.close()


def _refused(call, limit: str) -> str:
    with pytest.raises(GrammarLimitError) as err:
        call()
    message = str(err.value)
    assert err.value.limit == limit and "SamplingParams.guided_json" in message
    assert "\n" not in message and len(message) < 400, message  # no grammar dump
    return message


def test_static_bounds_name_their_limit():
    message = _refused(lambda: SamplingParams(guided_json=ref_chain(3000)), "max_depth")
    assert "3003 levels" in message and "limit of 128" in message
    message = _refused(lambda: SamplingParams(guided_json=wide_object(5000)), "max_nodes")
    assert "5002 JSON objects" in message and "limit of 4096" in message
    big = {"enum": ["x" * 1000] * 200}
    assert "limit of 131072" in _refused(lambda: SamplingParams(guided_json=big), "max_bytes")
    SamplingParams(guided_json=ref_chain(100))  # within every bound: compiles


def test_ref_depth_follows_refs_and_stops_at_recursion():
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    # root -> $defs -> node -> properties -> children -> items (-> node: recursion, cut)
    assert ref_depth(tree) == 6
    assert ref_depth(ref_chain(10)) == 13  # root -> $defs -> d0 -> ... -> d10
    assert ref_depth({"$ref": "#/$defs/missing"}) == 1  # llguidance reports it
    SamplingParams(guided_json=tree)


def test_a_crashing_schema_kills_a_worker_not_this_process(unbounded):
    message = _refused(lambda: unbounded.json_grammar(ref_chain(3000)), "compiler")
    assert "SIGSEGV" in message  # llguidance's stack overflow, in the worker
    assert unbounded.restarts == 2  # its own worker, then the retry on a fresh one
    assert unbounded.json_grammar(wide_object(3))  # a fresh worker serves the next schema
    _refused(lambda: unbounded.json_grammar(ref_chain(3000)), "compiler")
    assert unbounded.restarts == 2 and unbounded.hits == 1  # the refusal was cached


def test_a_killed_worker_is_replaced(unbounded):
    unbounded.json_grammar(wide_object(2))
    (pid,) = unbounded.worker_pids()
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, zombie_ok=True)
    assert unbounded.json_grammar(wide_object(4))
    assert unbounded.restarts == 1 and unbounded.worker_pids() != [pid]
    _wait_gone(pid)  # reaped


def test_a_hung_worker_is_killed_at_the_time_limit(unbounded):
    compiler = GrammarCompiler(CompileLimits(timeout_s=3.0))
    try:
        compiler.json_grammar(wide_object(2))
        (pid,) = compiler.worker_pids()
        os.kill(pid, signal.SIGSTOP)  # hangs on the next schema, whatever the machine's speed
        assert compiler.json_grammar(wide_object(5))  # answered by the replacement
        assert compiler.restarts == 1 and compiler.worker_pids() != [pid]
        _wait_gone(pid)
    finally:
        compiler.close()


def test_workers_run_under_the_memory_limit():
    compiler = GrammarCompiler(CompileLimits(memory_bytes=1536 << 20))
    try:
        compiler.json_grammar(wide_object(2))
        (pid,) = compiler.worker_pids()
        with open(f"/proc/{pid}/limits") as f:
            line = next(x for x in f if x.startswith("Max address space"))
        assert line.split()[3:5] == [str(1536 << 20)] * 2
    finally:
        compiler.close()


def test_verdicts_are_cached_by_schema(unbounded):
    schema = wide_object(50)
    grammar = unbounded.json_grammar(schema)
    for pid in unbounded.worker_pids():  # no worker is asked again: nothing to notice this
        os.kill(pid, signal.SIGKILL)
    assert unbounded.json_grammar(dict(schema)) == grammar
    assert (unbounded.hits, unbounded.misses, unbounded.restarts) == (1, 1, 0)
    assert unbounded.accepted(grammar) and not unbounded.accepted(grammar + " ")


def test_a_wide_object_is_refused_at_compile_time():
    message = _refused(lambda: SamplingParams(guided_json=wide_object(500)), "max_items_in_row")
    assert "2007 items" in message and "max_items_in_row of 2000" in message
    assert SamplingParams(guided_json=wide_object(400)).guided_grammar


@pytest.mark.parametrize("schema, words", [
    ({"$ref": "#"}, "no JSON value satisfies it"),
    ({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]},
     "no JSON value satisfies it"),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
     'no answer can end (a required part that contains itself); take the property that leads '
     'back into itself out of "required"'),
])
def test_a_schema_with_no_end_is_one_line_without_the_parser_state(schema, words):
    with pytest.raises(GraftConfigError) as err:
        SamplingParams(guided_json=schema)
    message = str(err.value)
    assert words in message and "not a usable JSON schema" in message, message
    assert "<state>" not in message and "grammars" not in message and len(message) < 400, message


def test_a_grammar_that_always_recurses_names_the_fix():
    with pytest.raises(GraftConfigError) as err:
        SamplingParams(guided_cfg='root ::= a\na ::= "x" a')
    assert str(err.value) == (
        "SamplingParams.guided_cfg is not a usable grammar: it forces an output of over 50000 "
        "tokens from the start, so no answer can end (a required part that contains itself); "
        "give the rule that always recurses an alternative that ends")
    assert SamplingParams(guided_cfg='root ::= a\na ::= "x" a | "y"').guided_grammar


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=64))


def test_only_checked_grammars_become_matchers(engine):
    with pytest.raises(GraftConfigError, match="not checked by the grammar compiler"):
        engine.grammar_tokenizer.prepare('{"grammars": [{"json_schema": {"type": "string"}}]}')
    grammar = SamplingParams(guided_json=wide_object(3)).guided_grammar
    template = engine.grammar_tokenizer.prepare(grammar)
    assert engine.grammar_tokenizer.prepare(grammar) is template  # built once per grammar


def test_a_row_limit_met_mid_generation_ends_that_request_alone(engine):
    late = SamplingParams(guided_json=LATE_WIDE, temperature=0.0, max_tokens=200)
    free = SamplingParams(temperature=0.0, max_tokens=24)
    prompt = engine.tokenizer("Fill in the form.")["input_ids"]
    alone = engine.generate(prompt_token_ids=[prompt], sampling_params=free)[0]
    outs = engine.generate(prompt_token_ids=[prompt, prompt], sampling_params=[late, free])
    assert outs[0].finish_reason == "error" and outs[0].token_ids
    assert "max_items_in_row of 2000" in outs[0].error and "\n" not in outs[0].error
    assert outs[1].finish_reason == "length" and outs[1].token_ids == alone.token_ids


def _wait_gone(pid: int, zombie_ok: bool = False) -> None:
    """Until `pid` has exited (a zombie not yet reaped counts when `zombie_ok`)."""
    for _ in range(400):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if zombie_ok and state == "Z":
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} is still there")
