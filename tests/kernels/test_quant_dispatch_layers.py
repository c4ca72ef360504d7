"""The C quant linears are one dispatcher over the ISA paths: quant_linear_cpu.c picks the
level and calls quant_vnni/amx/avx2/avx2_int_cpu.c, which never call back into it (a loop made the
level checks run in two places and the order of the paths hard to follow)."""

import re

from graft.kernels import cpu_ops
from graft.kernels.c_signatures import parse_prototypes

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def _calls(path) -> set[str]:
    return set(re.findall(r"\b(graft_\w+)\s*\(", _COMMENT.sub(" ", path.read_text())))


def test_the_isa_paths_never_call_the_dispatcher():
    files = {p.name: p for p in cpu_ops.SOURCES}
    dispatcher = set(parse_prototypes([files["quant_linear_cpu.c"]])["definitions"])
    assert {"graft_quant_linear", "graft_quant_isa"} <= dispatcher
    for name in ("quant_vnni_cpu.c", "quant_amx_cpu.c", "quant_avx2_cpu.c", "quant_avx2_int_cpu.c",
                 "quant_a8_cpu.c"):
        assert not _calls(files[name]) & dispatcher, name
    # and the dispatcher does reach every path
    assert {"graft_quant_linear_vnni", "graft_quant_amx_bf16", "graft_quant_linear_avx2", "graft_quant_int_avx2",
            "graft_quant_int4_a8", "graft_quant_round8"} \
        <= _calls(files["quant_linear_cpu.c"])
