#!/usr/bin/env python3
"""trim-gguf.py IN OUT N [--embd-q4_1] — write OUT: the GGUF IN with only its first N blocks (layers).

Every key and tensor is copied byte for byte except `<arch>.block_count` (set to N) and the tensors of blocks
N and above (dropped). The result is a smaller model with the same tokenizer, embedding, norms and output head:
not the original model's outputs, but a real GGUF of the same formats, for tests that compare two backends on
one model (gpu-check's test_cuda_model on a GPU box the full default model cannot travel to).
--embd-q4_1 also re-quantizes token_embd.weight to Q4_1 (the default model's is Q8_0: 30 of its 41 MB at 4 layers),
for a bundle under 40 MiB."""
import sys

try:
    import gguf
except ImportError as e:
    sys.exit(f"trim-gguf: {e} (python3 -m pip install gguf==0.17.1)")


def main():
    args = [a for a in sys.argv[1:] if a != "--embd-q4_1"]
    requant = len(args) != len(sys.argv) - 1
    if len(args) != 3:
        sys.exit("usage: trim-gguf.py IN OUT N_LAYERS [--embd-q4_1]")
    src, dst, n = args[0], args[1], int(args[2])
    r = gguf.GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    old_n = int(r.fields[f"{arch}.block_count"].parts[-1][0])
    if not 0 < n <= old_n:
        sys.exit(f"trim-gguf: {n} layers asked, the model has {old_n}")
    w = gguf.GGUFWriter(dst, arch, use_temp_file=False)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if name == f"{arch}.block_count":
            w.add_uint32(name, n)
        elif vt == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                w.add_array(name, [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data])
            else:
                w.add_array(name, [f.parts[i][0].item() for i in f.data])
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode("utf-8", "surrogateescape"))
        else:
            w.add_key_value(name, f.parts[-1][0].item(), vt)
    kept = 0
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n:
            continue
        if requant and t.name == "token_embd.weight" and t.tensor_type != gguf.GGMLQuantizationType.Q4_1:
            q1 = gguf.GGMLQuantizationType.Q4_1
            rows = gguf.quants.dequantize(t.data, t.tensor_type).astype("float32")
            w.add_tensor(t.name, gguf.quants.quantize(rows, q1), raw_dtype=q1)
        else:
            w.add_tensor(t.name, t.data, raw_shape=list(reversed([int(x) for x in t.data.shape])) if t.tensor_type in
                         (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16) else None,
                         raw_dtype=t.tensor_type)
        kept += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"trim-gguf: {dst}: {n} of {old_n} layers, {kept} tensors")


if __name__ == "__main__":
    main()
