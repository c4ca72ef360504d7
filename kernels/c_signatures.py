"""The C entry points Python calls, declared once: return type and argument types per function,
and the structs passed by pointer (ctypes Structures). `cpu_ops` sets ctypes' restype/argtypes
from this table, and every build first checks the table and the structs against
kernels/csrc/*.c (and those files' prototypes of each other against the definitions): a
mismatch would make ctypes pass garbage and corrupt memory silently, so it is an error naming
the function or struct instead."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

# short names for the C types ctypes passes: every pointer is a void pointer to ctypes
PTR, I64, INT, FLOAT, VOID = "ptr", "int64_t", "int", "float", "void"
CTYPES = {PTR: ctypes.c_void_p, I64: ctypes.c_int64, INT: ctypes.c_int, FLOAT: ctypes.c_float,
          VOID: None}

_QUANT = [INT, PTR, I64, I64, I64, PTR, PTR, PTR, PTR, I64, PTR, PTR, I64, I64]  # kind .. N
# name -> (return type, argument types), as kernels/csrc defines them
SIGNATURES: dict[str, tuple[str, list[str]]] = {
    "graft_paged_decode": (I64, [PTR] * 6 + [I64] * 7 + [FLOAT, PTR, PTR] + [INT] * 3),
    "graft_paged_prefill": (I64, [PTR] * 7 + [I64] * 7 + [FLOAT, PTR, PTR] + [INT] * 3),
    "graft_paged_prefill_built": (INT, []),
    "graft_prefill_amx_applies": (INT, [INT, INT, I64]),
    "graft_quant_unpack_fp32": (VOID, [PTR, I64, I64, PTR, INT]),
    "graft_rms_norm": (VOID, [PTR, I64, PTR, I64, PTR, PTR, PTR, I64, I64, FLOAT, INT, INT, INT]),
    "graft_rotary": (VOID, [PTR, I64, PTR, PTR, PTR, I64, I64, I64, I64] + [INT] * 4),
    "graft_silu_mul": (VOID, [PTR, I64, PTR, I64, I64, INT, INT]),
    "graft_store_kv_i8": (I64, [PTR, I64, PTR, I64] + [PTR] * 5 + [I64] * 4),
    "graft_store_kv": (I64, [PTR, I64, PTR, I64, PTR, PTR, PTR, I64, I64, I64, INT, INT]),
    "graft_quant_linear": (INT, _QUANT + [I64, INT]),
    "graft_quant_linear_portable": (VOID, _QUANT + [INT]),
    "graft_quant_isa": (INT, []),
    "graft_quant_cap_isa": (VOID, [INT]),
    "graft_quant_bf16_dot_built": (INT, []),
    "graft_quant_bf16_io": (INT, [PTR, I64, I64, I64, PTR, PTR, PTR, I64, I64, I64, INT]),
    "graft_decode_scratch": (I64, [PTR, PTR, I64, PTR, I64]),
    "graft_decode_layers": (I64, [PTR, PTR, I64, PTR, I64] + [PTR] * 9 + [INT]),
    "graft_moe_block_scratch": (I64, [PTR, I64, I64]),
    "graft_moe_block": (I64, [PTR, I64, I64, PTR, PTR, PTR, INT]),
    "graft_argmax_rows": (VOID, [PTR, I64, I64, I64, PTR, INT]),
    "graft_decode_step_scratch": (I64, [PTR, PTR, I64, PTR, I64]),
    "graft_decode_step": (I64, [PTR, PTR, I64, PTR, PTR, I64] + [PTR] * 7 + [INT]),
}


_ptr, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


# the descriptors of decode_types.h; `_c_name_` is the C typedef each mirrors
class LinearDesc(ctypes.Structure):
    _c_name_ = "graft_linear_t"
    _fields_ = [("kind", _i64), ("w", _ptr), ("scale8", _ptr), ("scales4", _ptr), ("mins4", _ptr),
                ("group", _i64), ("bias", _ptr), ("n", _i64), ("k", _i64), ("nb", _i64)]


class LayerDesc(ctypes.Structure):
    _c_name_ = "graft_layer_t"
    _fields_ = [("qkv", LinearDesc), ("o", LinearDesc), ("gate_up", LinearDesc),
                ("down", LinearDesc), ("in_norm", _ptr), ("post_norm", _ptr), ("q_norm", _ptr),
                ("k_norm", _ptr), ("k_cache", _ptr), ("v_cache", _ptr), ("k_scale", _ptr),
                ("v_scale", _ptr)]


class Dims(ctypes.Structure):
    _c_name_ = "graft_dims_t"
    _fields_ = [(name, _i64) for name in ("hidden", "num_heads", "num_kv_heads", "head_dim", "rot",
                                          "interleaved", "block_size", "num_blocks",
                                          "max_blocks", "cache_dtype", "act_dtype")] + \
               [("eps", _f32), ("qk_eps", _f32), ("scale", _f32)]


class PrefillDesc(ctypes.Structure):
    _c_name_ = "graft_prefill_t"
    _fields_ = [("num_decodes", _i64), ("num_seqs", _i64), ("tables", _ptr), ("max_blocks", _i64),
                ("cu_seqlens", _ptr), ("context_lens", _ptr)]


class StepDesc(ctypes.Structure):
    _c_name_ = "graft_step_t"
    _fields_ = [("embed", _ptr), ("vocab", _i64), ("final_norm", _ptr), ("final_eps", _f32),
                ("head", LinearDesc), ("cos_table", _ptr), ("sin_table", _ptr), ("max_pos", _i64),
                ("embed_kind", _i64), ("embed_group", _i64), ("embed_scales", _ptr), ("embed_mins", _ptr)]


class MoeDesc(ctypes.Structure):
    _c_name_ = "graft_moe_t"
    _fields_ = [("router", _ptr), ("router_bias", _ptr)] + \
               [(name, _i64) for name in ("num_experts", "top_k", "scoring", "norm_topk", "n_group",
                                          "topk_group")] + \
               [("routed_scale", _f32), ("gate_up", _ptr), ("down", _ptr),
                ("shared_gate_up", LinearDesc), ("shared_down", LinearDesc)]


STRUCTS = (LinearDesc, LayerDesc, Dims, PrefillDesc, StepDesc, MoeDesc)


class SignatureMismatch(TypeError):
    """The Python declaration of a C function disagrees with the C (never caught: a bug)."""


_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
# a prototype at the start of a line: return type, graft_ name, parameters, then `{` or `;`
_PROTO = re.compile(r"^(?!static\b)([A-Za-z_][\w \t]*?[\s*]+)(graft_\w+)\s*\(([^()]*)\)\s*([{;])",
                    re.M)


def _c_type(text: str) -> str:
    """`const float *x` -> "float*"; `int64_t n` -> "int64_t"; `void` -> "void"."""
    words = text.replace("*", " * ").replace("const", " ").split()
    stars = words.count("*")
    words = [w for w in words if w != "*"]
    return " ".join(words[:-1] if len(words) > 1 else words) + "*" * stars


def parse_prototypes(sources) -> dict[str, dict[str, list[tuple]]]:
    """{"definitions" | "declarations": {name: [(return type, [arg types], file), ...]}} of the
    non-static graft_* functions in `sources`."""
    found: dict[str, dict[str, list[tuple]]] = {"definitions": {}, "declarations": {}}
    for path in map(Path, sources):
        text = _COMMENT.sub(" ", path.read_text())
        for ret, name, params, end in _PROTO.findall(text):
            args = [] if params.strip() in ("", "void") else [_c_type(p) for p in params.split(",")]
            kind = "definitions" if end == "{" else "declarations"
            found[kind].setdefault(name, []).append((_c_type(ret + " x"), args, path.name))
    return found


def _as_ctype(c_type: str) -> str:
    return PTR if c_type.endswith("*") else c_type


def check_signatures(sources, declared: dict | None = None, structs=None) -> None:
    """SignatureMismatch naming the first function whose Python declaration (or a C prototype in
    another file) disagrees with its definition in `sources`, or the first struct whose fields
    (names and types, in order) differ from its C typedef."""
    _check_structs(sources, STRUCTS if structs is None else structs)
    found = parse_prototypes(sources)
    defs = found["definitions"]
    for name, (ret, args) in (SIGNATURES if declared is None else declared).items():
        if name not in defs:
            raise SignatureMismatch(f"{name}: declared in kernels/c_signatures.py but defined in "
                                    f"none of {[Path(s).name for s in sources]}")
        c_ret, c_args, where = defs[name][0]
        got = (_as_ctype(c_ret), [_as_ctype(a) for a in c_args])
        if got != (ret, list(args)):
            raise SignatureMismatch(
                f"{name}: kernels/c_signatures.py declares {_show(ret, args)} but {where} defines "
                f"{_show(*got)}; make the declaration match the C")
    for name, decls in found["declarations"].items():
        for ret, args, where in decls:
            if name in defs and (ret, args) != defs[name][0][:2]:
                raise SignatureMismatch(f"{name}: {where} declares {_show(ret, args)} but "
                                        f"{defs[name][0][2]} defines {_show(*defs[name][0][:2])}")


_STRUCT = re.compile(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", re.S)
_CTYPE_NAMES = {ctypes.c_void_p: PTR, ctypes.c_int64: I64, ctypes.c_int: INT, ctypes.c_float: FLOAT}


def parse_structs(sources) -> dict[str, list[tuple[str, str]]]:
    """{typedef name: [(field, type), ...]} of the `typedef struct {...} name;` in `sources`;
    pointers are "ptr" (what ctypes passes), `int64_t n, k;` gives two fields."""
    structs = {}
    for path in map(Path, sources):
        for body, name in _STRUCT.findall(_COMMENT.sub(" ", path.read_text())):
            fields = []
            for decl in filter(str.strip, body.split(";")):
                base, *rest = decl.replace("const", " ").replace("*", " * ").split(None, 1)
                for part in " ".join(rest).split(","):
                    fields.append((part.replace("*", "").strip(), PTR if "*" in part else base))
            structs[name] = fields
    return structs


def _check_structs(sources, structs) -> None:
    found = parse_structs(sources)
    for cls in structs:
        want = [(f, getattr(t, "_c_name_", None) or _CTYPE_NAMES.get(t, t.__name__))
                for f, t in cls._fields_]
        if cls._c_name_ not in found:
            raise SignatureMismatch(f"{cls.__name__}: its C struct {cls._c_name_} is defined in "
                                    f"none of {[Path(s).name for s in sources]}")
        if found[cls._c_name_] != want:
            raise SignatureMismatch(
                f"{cls.__name__} (kernels/c_signatures.py) has fields {want} but the C "
                f"{cls._c_name_} has {found[cls._c_name_]}; make the ctypes fields match the C")


def _show(ret: str, args: list[str]) -> str:
    return f"{ret}({', '.join(args)})"


def bind(lib: ctypes.CDLL) -> None:
    """Set restype and argtypes of every declared function on the loaded library."""
    for name, (ret, args) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = CTYPES[ret]
        fn.argtypes = [CTYPES[a] for a in args]
