#!/usr/bin/env python3
"""Writes the seed corpus of the safetensors fuzzer (tests/fuzz/corpus).

valid_*: files the loader must accept; bad_*: files it must reject with
ad::Error. The replay test (tests/nn_safetensors.cpp) checks both. Run from
anywhere: python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(here, exist_ok=True)


def raw(header, data=b"", length=None, pad=True):
    h = header.encode("utf-8") if isinstance(header, str) else header
    if pad:
        h += b" " * ((-(len(h) + 8)) % 8)
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + data


def tensors(items, meta=None):
    """items: (name, dtype, shape, bytes) in data order."""
    hdr, data = {}, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, b in items:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    return json.dumps(hdr, separators=(",", ":")), data


def put(name, content):
    with open(os.path.join(here, name), "wb") as f:
        f.write(content)


f32 = struct.pack("<4f", 1.0, -2.5, float("inf"), 0.0)
f64 = struct.pack("<2d", 3.25, float("nan"))
f16 = struct.pack("<3H", 0x3C00, 0x7E01, 0x8001)
bf16 = struct.pack("<2H", 0x3F80, 0xFF80)
i64 = struct.pack("<3q", -1, 0, 2**62)

h, d = tensors([("w", "F64", [2], f64), ("x", "F32", [2, 2], f32), ("e", "I64", [3], i64),
                ("h", "F16", [3], f16), ("b", "BF16", [1, 2], bf16)], {"format": "pt", "step": "12"})
put("valid_all_dtypes.safetensors", raw(h, d))
put("valid_empty.safetensors", raw("{}"))
put("valid_metadata_only.safetensors", raw(*tensors([], {"k": "v", "\u00e9": "\U0001F600"})))
put("valid_scalar.safetensors", raw(*tensors([("s", "F32", [], f32[:4])])))
put("valid_zero_size.safetensors", raw(*tensors([("z", "F32", [0, 5], b""), ("a", "F32", [1], f32[:4])])))
put("valid_unpadded_whitespace.safetensors",
    raw('{ "a" : { "shape" : [ 1 ] , "data_offsets" : [ 0 , 4 ] , "dtype" : "F32" } }\n\t', f32[:4], pad=False))
put("valid_escapes.safetensors", raw('{"a\\"\\\\\\/\\u00e9\\ud83d\\ude00":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}', i64[:8]))

good_h, good_d = tensors([("x", "F32", [2, 2], f32)])
full = raw(good_h, good_d)
put("bad_truncated_data.safetensors", full[:-3])
put("bad_truncated_header.safetensors", full[:20])
put("bad_truncated_length.safetensors", full[:5])
put("bad_header_too_long.safetensors", raw(good_h, good_d, length=len(full)))
put("bad_header_huge.safetensors", raw(good_h, good_d, length=2**62))
put("bad_json_syntax.safetensors", raw('{"x":{"dtype":"F32",}}'))
put("bad_json_trailing.safetensors", raw('{} {}'))
put("bad_not_object.safetensors", raw('[1,2]'))
put("bad_utf8.safetensors", raw(b'{"\xff":1}'))
put("bad_surrogate.safetensors", raw('{"\\udc00":1}'))
put("bad_deep.safetensors", raw('{"__metadata__":' + "[" * 200 + "]" * 200 + "}"))
put("bad_duplicate.safetensors", raw('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                     '"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32[:8]))
put("bad_dtype.safetensors", raw('{"x":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}}', f32[:4]))
put("bad_shape_negative.safetensors", raw('{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', f32[:4]))
put("bad_shape_overflow.safetensors",
    raw('{"x":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}'))
put("bad_size_mismatch.safetensors", raw('{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}', f32))
put("bad_overlap.safetensors", raw('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                   '"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', f32[:12]))
put("bad_gap.safetensors", raw('{"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', f32))
put("bad_out_of_range.safetensors", raw('{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', f32[:8]))
put("bad_offsets_reversed.safetensors", raw('{"x":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}', f32[:4]))
put("bad_trailing_data.safetensors", raw(good_h, good_d + b"\0\0\0\0"))
put("bad_metadata_value.safetensors", raw('{"__metadata__":{"k":["v"]}}'))
put("bad_missing_field.safetensors", raw('{"x":{"dtype":"F32","shape":[1]}}', f32[:4]))
put("bad_rank.safetensors", raw('{"x":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}', f32[:4]))
put("bad_number.safetensors", raw('{"x":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}', f32[:4]))
print(len(os.listdir(here)), "files in", here)
