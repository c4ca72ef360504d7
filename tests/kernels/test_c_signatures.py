"""The C functions' Python declarations (kernels/c_signatures.py) are checked against the C
prototypes before every build: a wrong argument count or type is an error naming the function,
never a library that ctypes calls with garbage."""

import shutil

import pytest

from graft.kernels import c_signatures, cpu_ops
from graft.kernels.c_signatures import (I64, INT, PTR, SIGNATURES, SignatureMismatch,
                                        check_signatures)


def test_the_declarations_match_the_c_sources():
    check_signatures(cpu_ops.SOURCES + cpu_ops.HEADERS)
    defs = c_signatures.parse_prototypes(cpu_ops.SOURCES + cpu_ops.HEADERS)["definitions"]
    assert set(SIGNATURES) <= set(defs)
    assert defs["graft_argmax_rows"][0][:2] == (
        "void", ["float*", "int64_t", "int64_t", "int64_t", "int64_t*", "int"])


@pytest.mark.parametrize("name, wrong, message", [
    ("graft_silu_mul", (c_signatures.VOID, [PTR, I64, PTR, I64, I64, INT]),  # one argument short
     "graft_silu_mul: kernels/c_signatures.py declares void(ptr, int64_t, ptr, int64_t, int64_t, "
     "int) but norm_rope_cpu.c defines void(ptr, int64_t, ptr, int64_t, int64_t, int, int)"),
    ("graft_argmax_rows", (c_signatures.VOID, [PTR, I64, I64, INT, PTR, INT]),  # int for int64_t
     "graft_argmax_rows: kernels/c_signatures.py declares"),
    ("graft_quant_isa", (I64, []), "graft_quant_isa: kernels/c_signatures.py declares int64_t()"),
    ("graft_no_such_kernel", (INT, []), "graft_no_such_kernel: declared in kernels/c_signatures.py "
     "but defined in none of"),
])
def test_a_mismatch_names_the_function(name, wrong, message):
    with pytest.raises(SignatureMismatch) as err:
        check_signatures(cpu_ops.SOURCES + cpu_ops.HEADERS, {**SIGNATURES, name: wrong})
    assert message in str(err.value)


def test_c_files_prototypes_of_each_other_are_checked_too(tmp_path):
    (tmp_path / "a.c").write_text(
        "#include <stdint.h>\n/* the definition */\n"
        "int64_t graft_twice(const float *x,\n    int64_t n) { return 2 * n; }\n"
        "static int graft_private(int a) { return a; }\n")
    (tmp_path / "b.c").write_text("int64_t graft_twice(const float *x, int n); // stale\n")
    with pytest.raises(SignatureMismatch, match=r"graft_twice: b.c declares int64_t\(float\*, "
                                                r"int\) but a.c defines int64_t\(float\*, "
                                                r"int64_t\)"):
        check_signatures([tmp_path / "a.c", tmp_path / "b.c"], {}, structs=())
    (tmp_path / "b.c").write_text("int64_t graft_twice(const float *x, int64_t n);\n")
    check_signatures([tmp_path / "a.c", tmp_path / "b.c"], {"graft_twice": (I64, [PTR, I64])},
                     structs=())
    assert "graft_private" not in c_signatures.parse_prototypes([tmp_path / "a.c"])["definitions"]


def test_the_build_refuses_a_wrong_declaration(tmp_path, monkeypatch):
    cc = cpu_ops._compiler()
    if cc is None or shutil.which(cc) is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("GRAFT_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setitem(SIGNATURES, "graft_rms_norm", (c_signatures.VOID, [PTR] * 13))
    with pytest.raises(SignatureMismatch, match="graft_rms_norm: "):
        cpu_ops._build(cc)
    assert not list(tmp_path.iterdir())  # refused before compiling: nothing in the cache


def test_the_ctypes_structs_match_the_c_typedefs():
    import ctypes

    check_signatures(cpu_ops.SOURCES + cpu_ops.HEADERS, structs=c_signatures.STRUCTS)

    class SwappedDims(ctypes.Structure):  # eps and qk_eps in the wrong order: wrong values read
        _c_name_ = "graft_dims_t"
        _fields_ = [f for f in c_signatures.Dims._fields_ if f[0] not in ("eps", "qk_eps")] \
            + [("qk_eps", ctypes.c_float), ("eps", ctypes.c_float)]

    class ShortLinear(ctypes.Structure):  # the last field dropped: every later layer misread
        _c_name_ = "graft_linear_t"
        _fields_ = c_signatures.LinearDesc._fields_[:-1]

    for cls in (SwappedDims, ShortLinear):
        with pytest.raises(SignatureMismatch, match=f"{cls.__name__} .* the C {cls._c_name_} has"):
            check_signatures(cpu_ops.SOURCES + cpu_ops.HEADERS, {}, structs=(cls,))
