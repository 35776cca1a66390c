#!/usr/bin/env python3
"""Chat-template fixtures for tests/test_tokenizer.c: the model's own Jinja template (tokenizer.chat_template of
the GGUF) and jinja2's renderings of it for a few conversations, so the C renderer is checked against the
template itself rather than against our reading of it.

    python3 scripts/chat_ref.py MODEL.gguf NAME    # writes tests/fixtures/chat/NAME.jinja and NAME.json
"""
import json, struct, sys

import jinja2

CASES = [
    [{"role": "user", "content": "Write a C function that returns the larger of two ints."}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Count to three."}],
]


def chat_template(path):
    """tokenizer.chat_template from GGUF metadata (v2/v3), reading only the key-value section."""
    with open(path, "rb") as f:
        magic, version, _n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF" and version in (2, 3), "not a GGUF v2/v3 file"
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8")

        def skip(t):
            if t == 8:
                string()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                for _ in range(n):
                    skip(et)
            else:
                f.read(sizes[t])

        for _ in range(n_kv):
            key = string()
            (t,) = struct.unpack("<I", f.read(4))
            if key == "tokenizer.chat_template":
                return string()
            skip(t)
    sys.exit("no tokenizer.chat_template in " + path)


def main():
    model, name = sys.argv[1:3]
    tmpl = chat_template(model)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    t = env.from_string(tmpl)
    out = [{"messages": m, "rendered": t.render(messages=m, add_generation_prompt=True, tools=None)} for m in CASES]
    with open(f"tests/fixtures/chat/{name}.jinja", "w", encoding="utf-8") as f:
        f.write(tmpl)
    with open(f"tests/fixtures/chat/{name}.json", "w", encoding="utf-8") as f:
        json.dump({"model": model.rsplit("/", 1)[-1], "jinja2": jinja2.__version__, "cases": out}, f, indent=1,
                  ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
