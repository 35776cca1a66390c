#!/usr/bin/env python3
"""Reference kept sets from kvpress (NVIDIA/kvpress): which prompt positions each press keeps, per layer and KV
head, after prefill on one prompt, written in kvbench's --dump-kept format so scripts/kept_compare.py can set them
beside kvbench's own dumps. The committed outputs live in tests/fixtures/kvpress/<method>.jsonl.

Run OUTSIDE CI, in a throwaway virtualenv outside the repository (CPU only, float32):

    python3 -m venv /work/venv-kvpress
    /work/venv-kvpress/bin/pip install torch        # CPU wheels index if reachable; plain PyPI otherwise
    /work/venv-kvpress/bin/pip install transformers gguf kvpress
    nice /work/venv-kvpress/bin/python scripts/kvpress_kept.py            # every press -> tests/fixtures/kvpress/

The second model (--model qwen2.5-coder-0.5b: Qwen2.5-Coder-0.5B-Instruct.gguf, 24 layers, 14 query heads on 2 KV
heads, q/k/v biases) runs on a shorter prompt so its test stays cheap, tests/fixtures/kvpress/qwen/prose_1500.txt
(prose_4000.txt's first 7624 bytes: 1540 ids, 462 per head at 30%), writing tests/fixtures/kvpress/qwen/. It has no
llama.cpp ids for that prompt: --ids is kvbench's own dump of it (the header's "prompt_ids"),

    build/kvbench generate --model qwen2.5-coder-0.5b --method snapkv --budget 30% -n 1 \
        --prompt-file tests/fixtures/kvpress/qwen/prose_1500.txt --dump-kept /tmp/qwen_ids.jsonl
    nice /work/venv-kvpress/bin/python scripts/kvpress_kept.py --model qwen2.5-coder-0.5b --ids /tmp/qwen_ids.jsonl

and transformers' dequantized model (biases included) is checked against llama.cpp's logits on the longest prompt of
tests/fixtures/llamacpp_ref_qwen.json instead (0.17 at most). Its GGUF is in Hugging Face's channel order already
(llama.cpp rotates Qwen2's keys NEOX-style, pairs (j, j + d/2)), so nothing is reordered for Q-Filters or ThinK.
Qwen2Config has no head_dim (CriticalKVPress reads it): it is set to hidden_size / heads. PyramidKVPress falls back
there at windows 64 and 32 (462 / 20 = 23 tokens on top), so pyramidkv_w16.jsonl is the pyramid's comparison.

Versions the committed fixtures were made with: torch 2.15.0 (the PyPI wheel, run on the CPU), transformers 5.2.0,
gguf 0.19.0, kvpress 0.5.5 (Python 3.11.7); model SmolLM2-135M-Instruct.Q4_1.gguf dequantized to float32 by
transformers' GGUF loader, attention "sdpa" (AdaKVPress refuses "eager").

Prompt ids: the ids kvbench feeds, never a re-tokenization. By default they come from
tests/fixtures/llamacpp_ref.json (llama.cpp's ids for the prompt file, which tests/test_model_llamacpp.c checks
equal kvbench's); --ids takes a kvbench --dump-kept file instead (its header's "prompt_ids"). This GGUF sets
tokenizer.ggml.add_bos_token false, so kvbench adds no BOS: 3765 ids for prose_4000.txt. transformers' GGUF
tokenizer prepends <|im_start|> (id 1) regardless; without special tokens its ids equal kvbench's. Both are
printed as a check, and the full prefill's last-position logits against llama.cpp's top 40 in llamacpp_ref.json
(kvbench equals llama.cpp there to 5e-6): transformers' float32 model is 0.48 away at most, within llama.cpp's own
spread across its kernels (0.44-0.74, README), since GGUF Q4_1 in llama.cpp rounds activations to 8 bits and
transformers does not. Nearly tied scores may therefore rank the other way: expect Jaccard a little below 1.

How the positions are recovered: kvpress prunes each layer's DynamicCache in a forward hook after the layer's
attention, so the prefill's hidden states do not depend on the press and a pruned cache holds exact copies of rows
of the unpressed cache (keys after RoPE, as cached). One plain prefill gives the full keys; each press's prefill
gives the surviving rows, matched back to positions by their bytes (the full rows of every head are checked to be
distinct, so the match is unique). AdaKVPress does not prune: it leaves the cache whole and records the pairs it
evicts in each attention module's masked_key_indices; the kept positions of a head are the others.

Presses (compression_ratio = 1 - budget = 0.7) and the kvbench method + options meant to reproduce them; the
press's own fields go in "kvpress_params". kvpress keeps int(n * 0.3) per head (1129 of 3765; PyramidKV its layer
budget, AdaKV that many per head on average), kvbench llround(0.3 * n) (1130): the header's "tokens_per_head" is
kvpress's count, to run kvbench with `--budget 1129` where the sets should match exactly.
    SnapKVPress(window_size=64, kernel_size=5)          snapkv        window=64,kernel=5,pool=avg
    StreamingLLMPress(n_sink=4)                         streamingllm  sinks=4
    TOVAPress()  (last query, mean over all heads)      tova          per_head=0
    KnormPress() (lowest key L2 norm, no window)        knorm         window=0
    PyramidKVPress(window_size=64, kernel_size=5, beta=20)  pyramidkv  window=64,kernel=5,pool=avg,beta=20
    PyramidKVPress(window_size=32, kernel_size=5, beta=20)  pyramidkv  window=32,kernel=5,pool=avg,beta=20
                                                        (file pyramidkv_w32.jsonl)
    AdaKVPress(SnapKVPress(64, 5), alpha_safeguard=0.2) adakv         base=snapkv,window=64,kernel=5,pool=avg,alpha=0.2
    LagKVPress(n_sink=4, lag_size=128)                  lagkv         sinks=4,lag=128,cross=0
    CURPress()  (kv_product, local windows of 16)       cur           leverage=kv_product,sinks=4,window=16
    CriticalKVPress(SnapKVPress(64, 5))                 criticalkv    base=snapkv,window=64,kernel=5,pool=avg
    CriticalAdaKVPress(SnapKVPress(64, 5), alpha_safeguard=0.2)  criticalkv  base=adakv,window=64,kernel=5,pool=avg,
                                                        alpha=0.2 (file criticalkv_ada.jsonl)
    LeverageScorePress(sketch_dimension=48)             compactor     (kvbench: the exact leverage, no sketch; the
                                                        press's Gaussian sketch is drawn after torch.manual_seed(0))
    LeverageScorePress(sketch_dimension=64)             compactor     (file compactor_d64.jsonl: a square sketch is
                                                        invertible, so the leverage is exact, as kvbench's)
    CompactorPress(sketch_dimension=64)                 compactor     mode=compactor (file compactor_blend_d64.jsonl:
                                                        the blend with the non-causal chunked attention)
    CompactorPress(blending=0.0)                        compactor     mode=compactor,blend=0 (compactor_attn.jsonl: the
                                                        non-causal chunked attention term alone)
    AdaKVPress(CompactorPress(sketch_dimension=64))     compactor     mode=compactor,ada=1,alpha=0.2 (compactor_ada_d64)
    AdaKVPress(CompactorPress())                        compactor     the leaderboard's adakv_compactor, sketched
                                                        (compactor_ada.jsonl, for the record)
    ExpectedAttentionPress()  (covariance, value norms) expected      window=4096 (kvpress's statistics: every query but
                                                        the sinks; test_kvpress_kept prefills it on its own)
    KeyDiffPress()                                      keydiff       (none)
    ObservedAttentionPress()  (eager attention)         observed      (none; its own eager model and full prefill)
    ChunkKVPress(SnapKVPress(64, 5), chunk_length=20)   chunkkv       base=snapkv,window=64,kernel=5,pool=avg,chunk=20
                                                        (at the press's own count: 55 whole chunks + the last 5)
    FinchPress(normalize_scores=False, rerotate_keys=False), window 32   finch  question=32,chunk=8192 (one chunk)
    FinchPress(rerotate_keys=False), window 32          finch         (file finch_norm.jsonl: the press's score
                                                        normalisation, which kvbench does not apply; for the record)
    QFilterPress()  fed kvbench's filters, negated      qfilter       filters=profile
    DuoAttentionPress()  fed kvbench's head split       duo           split=profile,sink=16,recent=64
    KVzipPress()  (chunk_size 2048, n_sink 4, global)   kvzip         chunk=2048,sinks=4,alloc=global
    ThinKPress(key_channel_compression_ratio=0.4)       think         base=none,lambda=0.4,window=32 (key channels, not
                                                        tokens: each line's "channels", in the GGUF's order)
    KVzapPress(model_type="mlp")                        kvzap         scorer=(the seeded MLP scorer, KVZAP_SCORERS) (file
                                                        kvzap_mlp.jsonl: per-head top-k of the scorer's scores)
    AdaKVPress(KVzapPress("mlp"), alpha_safeguard=0.2)  kvzap         scorer=...,ada=1,alpha=0.2 (kvzap_mlp_ada.jsonl)
    DMSPress(KVzapPress("mlp"), threshold=0, sliding_window_size=128)  kvzap  scorer=...,threshold=0,window=128
                                                        (kvzap_mlp_dms.jsonl: kvpress's leaderboard "kvzap_mlp"; no
                                                        budget: "budget" and "tokens_per_head" null)
    DMSPress(KVzapPress("linear"), threshold=0, sliding_window_size=128)  kvzap  scorer=(the seeded linear scorer),
                                                        threshold=0,window=128 (kvzap_linear_dms.jsonl)

The Hub is out of reach here: QFilterPress's filters and DuoAttentionPress's head patterns are kvbench's own, read
from the model's kvbench profile (`kvbench calibrate qfilter`, `kvbench calibrate duo`; --profile, default the
model's under ~/.cache/kvbench/profiles) and copied into the fixture's header ("profile"), which test_kvpress_kept
stores in a profile directory of its own: the comparison checks the scoring and the selection given the same
filters or head scores, not the filters. DuoAttentionPress is given the split kvbench's duo makes (the top R heads
by score retrieve; the others keep 16 sinks and their recent tokens) at the budget nearest below 1129 where the
streaming heads' share divides evenly (1126: 25 retrieval heads, 65 streaming heads of 16 + 95). FinchPress's window
is the question after a delimiter token its pipeline inserts: here the window is set to 32 (the prompt's last 32
tokens, kvbench's question) and no delimiter occurs; rerotate_keys=False keeps the kept key rows byte-equal to the
full prefill's. KVzipPress reads the chat template for its prefix (not reconstructed) and suffix (the assistant
opening): it is given the GGUF's tokenizer with a template whose prefix is empty and whose suffix is the model's
("<|im_end|>\n<|im_start|>assistant\n", kvbench's assistant_opening), since the prompt is bare text that kvbench
reconstructs whole. KVzapPress would download its scorer (nvidia/KVzap-<mlp|linear>-<model>): it is given seeded
seeded ones instead (KVZAP_SCORERS: a splitmix64 stream rounded to bfloat16, which test_kvpress_kept writes the same
way as a safetensors file at test time; no weight file is committed), their weights cast to float32, and
its post_init_from_model is a no-op. DMSPress evicts, per KV head, the positions before the last 128 whose score is
below the threshold, recorded (like AdaKV's) in masked_key_indices; each threshold was chosen to evict about half of
the (layer, head, position) triples (printed). ObservedAttentionPress needs the attention weights ("eager"): it
runs on a second copy of the model loaded with eager attention, whose full prefill gives its own key rows to match.

PyramidKVPress with its defaults falls back to uniform SnapKV on this prompt at 30%: its top layer would keep
budget/beta = 1129.5 / 20 = 56.5 tokens, fewer than its window of 64, so every layer keeps round(0.3 n) = 1130
(pyramidkv.jsonl says so in a "note"). pyramidkv_w32.jsonl is the same press with window 32, where the pyramid
is active: 2203 tokens per head in layer 0 down to 56 in layer 29 ("kept_per_layer" has the sums over heads).
kvpress shapes the whole per-head budget B into the pyramid (the window inside each layer's count); kvbench's
pyramidkv shapes B - window (as KVCache-Factory), so their layer counts differ by up to about a window even where
neither falls back.

Output, one file per press: line 1 {"method", "opts", "budget", "n_prompt", "tokens_per_head", "kept_per_layer"
(tokens kept per layer, summed over its KV heads), "source", "kvpress_params", "model", "prompt", "note" (when
there is one), "profile" (the kvbench profile sections the press was fed: qfilter, duo), "channels_per_head" (a
channel press: think)}, then one line per (layer, KV head): {"when": "prefill", "layer": L, "kv_head": H,
"positions": [...]}, positions ascending; a channel press's lines hold "channels": [...] (ascending, the GGUF's
order) instead, every position being kept.
"""
import argparse
import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader's per-tensor progress bars
MODEL_DIR = os.path.expanduser("~/.cache/kvbench/models")
# --model NAME: the GGUF, the prompt, where its ids come from, the output directory and a llama.cpp fixture whose
# longest prompt checks transformers' dequantized model (kvbench equals llama.cpp there, test_model_llamacpp)
MODELS = {
    "default": {"gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "prompt": "tests/fixtures/prompts/prose_4000.txt",
                "ids": "tests/fixtures/llamacpp_ref.json", "out": "tests/fixtures/kvpress", "ref": None},
    # the second model on a shorter prompt (prose_4000.txt's first 7624 bytes: 1540 ids), so its test stays cheap;
    # no llama.cpp ids for it: --ids is a kvbench --dump-kept file of the prompt
    "qwen2.5-coder-0.5b": {"gguf": "Qwen2.5-Coder-0.5B-Instruct.gguf",
                           "prompt": "tests/fixtures/kvpress/qwen/prose_1500.txt", "ids": None,
                           "out": "tests/fixtures/kvpress/qwen", "ref": "tests/fixtures/llamacpp_ref_qwen.json"},
}


def press_table(ratio, ctx):
    """Output name -> a function giving (kvbench method, kvpress press, kvbench --method-opt string, extras), so a
    press is built only when it is run. extras: "attn" (the attention the press needs: "eager" for the attention
    weights), "tokens_per_head" (the count the press keeps per head where it is not kvpress's int(n (1 - ratio))),
    "profile" (kvbench profile sections the press was fed, copied into the header for test_kvpress_kept), "note"."""
    from kvpress import (AdaKVPress, ChunkKVPress, CompactorPress, CriticalAdaKVPress, CriticalKVPress, CURPress,
                         FinchPress,
                         KeyDiffPress, KnormPress, KVzipPress, LagKVPress, ExpectedAttentionPress, LeverageScorePress,
                         ObservedAttentionPress, PyramidKVPress, SnapKVPress, StreamingLLMPress, TOVAPress)

    snap = "window=64,kernel=5,pool=avg"
    fixed = {
        "snapkv": ("snapkv", lambda: SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5), snap),
        "streamingllm": ("streamingllm", lambda: StreamingLLMPress(compression_ratio=ratio, n_sink=4), "sinks=4"),
        "tova": ("tova", lambda: TOVAPress(compression_ratio=ratio), "per_head=0"),
        "knorm": ("knorm", lambda: KnormPress(compression_ratio=ratio), "window=0"),
        "pyramidkv": ("pyramidkv", lambda: PyramidKVPress(compression_ratio=ratio, window_size=64, kernel_size=5,
                                                          beta=20), snap + ",beta=20"),
        "pyramidkv_w32": ("pyramidkv", lambda: PyramidKVPress(compression_ratio=ratio, window_size=32, kernel_size=5,
                                                              beta=20), "window=32,kernel=5,pool=avg,beta=20"),
        # the second model's 1540-token prompt: 462 / 20 = 23 tokens on top, below a window of 32 (the fallback);
        # a window of 16 keeps the pyramid
        "pyramidkv_w16": ("pyramidkv", lambda: PyramidKVPress(compression_ratio=ratio, window_size=16, kernel_size=5,
                                                              beta=20), "window=16,kernel=5,pool=avg,beta=20"),
        "adakv": ("adakv", lambda: AdaKVPress(SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5),
                                              alpha_safeguard=0.2), "base=snapkv," + snap + ",alpha=0.2"),
        "lagkv": ("lagkv", lambda: LagKVPress(compression_ratio=ratio, n_sink=4, lag_size=128),
                  "sinks=4,lag=128,cross=0"),
        "cur": ("cur", lambda: CURPress(compression_ratio=ratio), "leverage=kv_product,sinks=4,window=16"),
        "criticalkv": ("criticalkv", lambda: CriticalKVPress(SnapKVPress(compression_ratio=ratio, window_size=64,
                                                                         kernel_size=5)), "base=snapkv," + snap),
        "criticalkv_ada": ("criticalkv", lambda: CriticalAdaKVPress(SnapKVPress(compression_ratio=ratio, window_size=64,
                                                                                kernel_size=5), alpha_safeguard=0.2),
                           "base=adakv," + snap + ",alpha=0.2"),
        "compactor": ("compactor", lambda: LeverageScorePress(compression_ratio=ratio, sketch_dimension=48), ""),
        "expected": ("expected", lambda: ExpectedAttentionPress(compression_ratio=ratio), "window=4096"),
        # a square sketch (head_dim 64 on the default model) is invertible: the exact leverage, kvbench's definition
        "compactor_d64": ("compactor", lambda: LeverageScorePress(compression_ratio=ratio, sketch_dimension=64), ""),
        # CompactorPress: the leverage blended with the non-causal chunked attention, 8 + 4 ends protected; with the
        # square sketch (exact), alone and as the leaderboard's adakv_compactor row wraps it; and the leaderboard's
        # row itself, its 48-column sketch (for the record)
        "compactor_blend_d64": ("compactor", lambda: CompactorPress(compression_ratio=ratio, sketch_dimension=64),
                                "mode=compactor"),
        "compactor_ada_d64": ("compactor", lambda: AdaKVPress(CompactorPress(compression_ratio=ratio,
                                                                             sketch_dimension=64),
                                                              alpha_safeguard=0.2), "mode=compactor,ada=1,alpha=0.2"),
        # the non-causal attention term alone (blending 0): kvbench's mode=compactor,blend=0
        "compactor_attn": ("compactor", lambda: CompactorPress(compression_ratio=ratio, blending=0.0),
                           "mode=compactor,blend=0"),
        "compactor_ada": ("compactor", lambda: AdaKVPress(CompactorPress(compression_ratio=ratio), alpha_safeguard=0.2),
                          "mode=compactor,ada=1,alpha=0.2"),
        "keydiff": ("keydiff", lambda: KeyDiffPress(compression_ratio=ratio), ""),
        "kvzip": ("kvzip", lambda: KVzipPress(compression_ratio=ratio), "chunk=2048,sinks=4,alloc=global"),
    }
    table = {name: (lambda m=m, f=f, o=o: (m, f(), o, {})) for name, (m, f, o) in fixed.items()}
    table["observed"] = lambda: ("observed", ObservedAttentionPress(compression_ratio=ratio), "", {"attn": "eager"})

    def chunkkv():
        press = ChunkKVPress(SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5), chunk_length=20)
        return ("chunkkv", press, "base=snapkv," + snap + ",chunk=20",
                {"tokens_per_head": "kept", "note": "ChunkKVPress keeps max(1, int(chunks x (1 - ratio))) whole "
                 "chunks of 20 (the short last one among them); tokens_per_head is what they hold, the count "
                 "kvbench is run at, so both keep whole chunks"})

    def finch():
        # FinchPress's window is the question after its delimiter token; kvbench's prompt has no delimiter, so the
        # window is set to the prompt's last 32 tokens (kvbench's question=32), with a delimiter id that never occurs.
        # rerotate_keys=False keeps the kept key rows byte-equal to the full prefill's (the match by bytes);
        # normalize_scores=False: kvbench's finch sums the question rows' probabilities without the press's
        # per-row key count (finch_norm.jsonl is the press's default, for the record).
        press = FinchPress(compression_ratio=ratio, normalize_scores=False, rerotate_keys=False)
        press.window_size, press.delimiter_token_id = 32, -1
        return ("finch", press, "question=32,chunk=8192", {})

    def finch_norm():
        _, press, opts, extra = finch()
        press.normalize_scores = True
        return ("finch", press, opts, extra)

    def qfilter():
        # The authors' filters live on the Hugging Face Hub (unreachable here): the press is fed kvbench's own, from
        # `kvbench calibrate qfilter`'s profile, negated since the press scores -<f, k> and kvbench <u, k>.
        import torch
        from kvpress import QFilterPress

        section = ctx["profile"]()["qfilter"]
        press = QFilterPress(compression_ratio=ratio)
        filters = -torch.tensor(section["filters"], dtype=torch.float32)
        # kvbench's filters are in the GGUF's key layout, where RoPE rotates adjacent pairs (2j, 2j+1); transformers'
        # GGUF loader un-permutes the key projection to its own layout, pairs (j, j + d/2): the same vector, its
        # components reordered, component 2j + s of the GGUF's is component s d/2 + j of transformers'
        # (Qwen2's GGUF keeps the HF order, NEOX RoPE on (j, j + d/2), and its loader permutes nothing: no reorder)
        L, H, d = filters.shape
        if ctx["permuted"]:
            filters = filters.reshape(L, H, d // 2, 2).transpose(-1, -2).reshape(L, H, d).contiguous()
        press.post_init_from_model = lambda model: setattr(press, "q_filters", filters)
        return ("qfilter", press, "filters=profile", {"profile": {"qfilter": section}})

    def duo():
        # DuoAttentionPress's head patterns come from the authors' repository (unreachable here): the press is fed
        # kvbench's calibrated head scores (`kvbench calibrate duo`'s profile) and the split kvbench's duo makes at
        # a budget where every streaming head holds the same count: R = floor(H (B - s) / (n - s)) heads retrieve,
        # the other H - R keep the first 16 and the last w - 16 tokens, w = (H B - R n) / (H - R).
        import numpy as np
        import torch
        from kvpress import DuoAttentionPress

        section = ctx["profile"]()["duo"]
        scores = np.array(section["scores"], dtype=float)
        H, n, sink, recent = scores.size, ctx["n"], 16, 64
        s = sink + recent
        B = int(n * (1 - ratio))
        while (H * B - (H * (B - s) // (n - s)) * n) % (H - H * (B - s) // (n - s)):
            B -= 1  # the nearest budget below kvpress's where the streaming heads' share divides evenly
        R = H * (B - s) // (n - s)
        w = (H * B - R * n) // (H - R)
        press = DuoAttentionPress(head_compression_ratio=(H - R) / H)

        def post_init(model):
            press.sink_size, press.recent_size = sink, w - sink
            # kvbench: the top R heads by score retrieve, ties to the lower layer, then head; argsort is stable
            order = np.argsort(-scores, axis=None, kind="stable")
            mask = np.ones(scores.size, dtype=bool)
            mask[order[:R]] = False
            press.streaming_mask = torch.tensor(mask.reshape(scores.shape))

        press.post_init_from_model = post_init
        return ("duo", press, f"split=profile,sink={sink},recent={recent}",
                {"tokens_per_head": B, "profile": {"duo": section},
                 "note": f"{R} of {H} heads retrieve (the whole prompt), the other {H - R} keep the first {sink} and "
                         f"the last {w - sink} tokens: kvbench's split at {B} tokens per head"})

    def think():
        # ThinK prunes key channels, not tokens: every position stays, and the press zeroes the pruned channels of the
        # cached keys; the kept channels of a head are those not all zero, written in kvbench's (the GGUF's) channel
        # order (see channels_kept)
        from kvpress import ThinKPress

        press = ThinKPress(key_channel_compression_ratio=0.4, window_size=32)
        return ("think", press, "base=none,lambda=0.4,window=32",
                {"channels": True, "tokens_per_head": ctx["n"],
                 "note": "key channels kept per layer and KV head (\"channels\", kvbench's GGUF channel order" +
                         (": transformers' channel s d/2 + j is the GGUF's 2j + s" if ctx["permuted"] else
                          ", transformers' too") + "); every position is kept (no \"positions\")"})

    def kvzap(kind, wrap=None, threshold=None):
        # KVzapPress scores each token from the hidden states its attention layer sees (after input_layernorm)
        # with a per-layer surrogate (Linear, or Linear-GELU-Linear) giving one score per KV head. Its
        # post_init_from_model would download nvidia/KVzap-<kind>-<model> from the Hub (unreachable here): it is
        # monkeypatched to a no-op on the press instance (AdaKVPress and DMSPress call the inner press's), and the
        # press is given the seeded scorer of KVZAP_SCORERS (kvzap_scorer), its bf16
        # weights cast to float32 as kvbench reads them; kvzap_model_name records that directory (never loaded by
        # name: post_init_from_model does nothing).
        from kvpress import DMSPress, KVzapPress

        rel = f"SEEDED_{kind.upper()}"  # test_kvpress_kept writes the scorer and names its path
        inner = KVzapPress(model_type=kind, compression_ratio=0.0 if threshold is not None else ratio)
        inner.kvzap_model = kvzap_scorer(kind, ctx["config"])
        inner.kvzap_model_name = rel
        inner.post_init_from_model = lambda model: None
        opts = f"scorer={rel}"
        extra = {"note": "layer 0's scores depend on the token id alone (its hidden states are the normalized "
                         "embeddings): repeated tokens tie, and torch.topk keeps an unspecified part of a tied group "
                         "at the cutoff (prose_4000.txt has 130 distinct ids: ties at the cutoff in layer 0 only); "
                         "the scorer's weights are seeded random (not NVIDIA's)"}
        if wrap == "ada":
            press = AdaKVPress(inner, alpha_safeguard=0.2)
            opts += ",ada=1,alpha=0.2"
        elif threshold is not None:  # kvpress's leaderboard "kvzap_<kind>": DMS, no budget
            press = DMSPress(press=inner, threshold=threshold, sliding_window_size=128, decoding=False)
            opts += f",threshold={threshold:.2f},window=128"
            extra = {"no_budget": True,
                     "note": f"DMSPress(threshold={threshold:.2f}, sliding_window_size=128): every (KV head, position) "
                             "before the last 128 whose score is < threshold is evicted; no budget (\"budget\" and "
                             "\"tokens_per_head\" null); the scorer's weights are seeded random (not NVIDIA's)"}
        else:
            press = inner
        return ("kvzap", press, opts, extra)

    table.update(
        kvzap_mlp=lambda: kvzap("mlp"),
        kvzap_mlp_ada=lambda: kvzap("mlp", "ada"),
        kvzap_mlp_dms=lambda: kvzap("mlp", threshold=KVZAP_THRESHOLDS["mlp"]),
        kvzap_linear_dms=lambda: kvzap("linear", threshold=KVZAP_THRESHOLDS["linear"]))
    table.update(chunkkv=chunkkv, finch=finch, finch_norm=finch_norm, qfilter=qfilter, duo=duo, think=think)
    return table


# KVzap's scorers: no trained weights for this model are reachable (NVIDIA's are on the Hub), and no weight file is
# committed: the fixtures use seeded scorers that test_kvpress_kept writes the same way at test time (its
# write_kvzap_scorer). KVzapModel(KVzapConfig(input_dim=hidden_size, output_dim=num_key_value_heads,
# n_modules=num_hidden_layers, hidden_dim)); per layer in order, the first Linear's weight [r1][in] and bias [r1], then
# (MLP) the second's weight [out][hid] and bias [out]; every value from one splitmix64 stream seeded `seed`:
# u = (x >> 11) / 2^53, v = scale (2u - 1) / sqrt(fan_in) (fan_in: the Linear's input width; scale per Linear), rounded
# to float32 and then to bfloat16 (round to nearest even), which kvbench reads back as float32 exactly. The hidden
# states after input_layernorm are small (RMS 0.05-0.25): the scales spread a head's scores by about 1.
KVZAP_SCORERS = {"mlp": {"hidden_dim": 16, "seed": 1, "scale": (10.0, 3.0)},  # (first Linear, second Linear)
                 "linear": {"hidden_dim": None, "seed": 2, "scale": (10.0,)}}
# DMS thresholds: 0, about half the prompt's (layer, head, position) triples evicted (the fraction is printed)
KVZAP_THRESHOLDS = {"mlp": 0.0, "linear": 0.0}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def splitmix_values(seed, n, scale, fan_in):
    mask = (1 << 64) - 1
    state = seed & mask
    out = []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        u = (z >> 11) / 9007199254740992.0
        out.append(scale * (2.0 * u - 1.0) / fan_in ** 0.5)
    return out, state


def kvzap_scorer(kind, cfg):
    """The seeded KVzap scorer of KVZAP_SCORERS (as test_kvpress_kept writes it), its bfloat16 weights as float32."""
    import torch
    from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

    spec = KVZAP_SCORERS[kind]
    scorer = KVzapModel(KVzapConfig(input_dim=cfg.hidden_size, output_dim=cfg.num_key_value_heads,
                                    n_modules=cfg.num_hidden_layers, hidden_dim=spec["hidden_dim"]))
    state = spec["seed"]
    with torch.no_grad():
        for module in scorer.layers:
            linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
            for lin, sc in zip(linears, spec["scale"]):
                for t in (lin.weight, lin.bias):
                    vals, state = splitmix_values(state, t.numel(), sc, lin.in_features)
                    t.copy_(torch.tensor(vals, dtype=torch.float64).to(torch.float32).to(torch.bfloat16)
                            .to(torch.float32).reshape(t.shape))
    return scorer.eval()


def press_params(press):
    """The press's dataclass fields (nested presses included; not those hidden from its repr, DMSPress's per-run
    buffers), with its class name; a press that is no dataclass (CriticalKVPress) by its public attributes."""
    out = {"press": type(press).__name__}
    names = ([f.name for f in dataclasses.fields(press) if f.repr] if dataclasses.is_dataclass(press)
             else [k for k in vars(press) if not k.startswith("_")])
    for name in names:
        v = getattr(press, name)
        if hasattr(v, "compress"):
            v = press_params(v)
        elif hasattr(v, "tolist"):  # a tensor fed to the press (Q-Filters' filters, DuoAttention's head mask)
            v = f"tensor {list(v.shape)}"
        elif callable(v) or (v is not None and not isinstance(v, (int, float, str, bool, list, dict))):
            continue
        out[name] = v
    return out


def kvbench_ids(path, prompt):
    """The record holding the prompt ids kvbench feeds ("prompt_ids"): a kvbench --dump-kept file's header line, or
    llamacpp_ref.json's entry for the prompt file's name (which also holds llama.cpp's last-position top logits)."""
    with open(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = json.loads(text.splitlines()[0])  # a JSON-lines dump: the header line
    if "prompt_ids" in doc:
        return doc
    name = os.path.basename(prompt)
    for p in doc.get("prompts", []):
        if p["name"] == name:
            return p
    sys.exit(f"{path}: no prompt_ids for {name}")


def check_logits(logits, rec):
    """How far transformers' float32 model is from llama.cpp (and so from kvbench, which test_model_llamacpp holds
    to llama.cpp): the last position's logits of llama.cpp's top ids."""
    if "top_ids" not in rec:
        return
    d = max(abs(float(logits[i]) - v) for i, v in zip(rec["top_ids"], rec["top_logits"]))
    print(f"last-position logits vs llama.cpp's top {len(rec['top_ids'])}: max |difference| {d:.4f}")


def check_tokenizer(model_dir, model_file, text, ids):
    """Print whether transformers' GGUF tokenizer gives kvbench's ids, with and without its special tokens
    (informative only: kvbench's ids are what the model is fed)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    except Exception as e:  # the GGUF tokenizer conversion is optional here
        print(f"transformers tokenizer: not available ({type(e).__name__}: {e})")
        return
    for special in (True, False):
        hf = tok(text, add_special_tokens=special)["input_ids"]
        first = next((i for i, (a, b) in enumerate(zip(hf, ids)) if a != b), min(len(hf), len(ids)))
        verdict = "identical" if hf == ids else f"differ from index {first} (first ids {hf[:2]})"
        print(f"transformers tokenizer, add_special_tokens={special}: {len(hf)} ids, kvbench {len(ids)}: {verdict}")


def cached_keys(cache, n_layer):
    return [cache.layers[l].keys[0].detach().clone() for l in range(n_layer)]


def row_index(full):
    """Per KV head, a dict from a key row's bytes to its position (rows checked distinct)."""
    index = []
    for h in range(full.shape[0]):
        rows = full[h].contiguous().numpy()
        d = {rows[i].tobytes(): i for i in range(rows.shape[0])}
        if len(d) != rows.shape[0]:
            sys.exit("two positions hold identical key rows: byte matching would be ambiguous")
        index.append(d)
    return index


def kept_pruned(index, kept):
    """Positions of the rows a pruning press left in one layer's cache, per head, ascending."""
    out = []
    for h, d in enumerate(index):
        rows = kept[h].contiguous().numpy()
        pos = [d.get(rows[i].tobytes()) for i in range(rows.shape[0])]
        if None in pos or len(set(pos)) != len(pos):
            sys.exit("a kept key row matches no position of the full prefill (or two): the runs differ")
        out.append(sorted(pos))
    return out


def kept_masked(module, n_head_kv, n):
    """AdaKV: every position but those in module.masked_key_indices, per head (None: none masked, a DMSPress layer
    that evicted nothing)."""
    masked = [set() for _ in range(n_head_kv)]
    if module.masked_key_indices is not None:
        _, heads, seqs = module.masked_key_indices
        for h, s in zip(heads.tolist(), seqs.tolist()):
            masked[h].add(s)
    module.masked_key_indices = None
    return [[i for i in range(n) if i not in m] for m in masked]


def kvzip_tokenizer(model_dir, model_file):
    """KVzipPress loads the model's tokenizer by name and reads its chat template for the text around the
    reconstruction: the prefix (the template's opening, skipped: not reconstructed, scored 0) and the suffix (what
    comes after a user turn: the assistant's opening). kvbench's prompt here is the bare text (no template), which
    kvbench reconstructs whole: the press gets the GGUF's tokenizer with a template that has the same suffix (the
    model's <|im_end|> and assistant opening, kvbench's assistant_opening) and no prefix."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    class Loader:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            return tok

    return Loader


def channels_kept(keys, permuted):
    """Per KV head, the key channels a channel-pruning press (ThinK) left nonzero in one layer's cache, in the GGUF's
    order: transformers' GGUF loader un-permutes the key projection so that RoPE rotates the pairs (j, j + d/2), where
    the GGUF (and kvbench) rotates (2j, 2j + 1); transformers' channel s d/2 + j is the GGUF's 2j + s. permuted False
    (Qwen2: the GGUF already rotates (j, j + d/2), the loader permutes nothing): the same order on both sides."""
    d = keys.shape[-1]
    out = []
    for h in range(keys.shape[0]):
        nonzero = (keys[h] != 0).any(dim=0).tolist()
        out.append(sorted((2 * (c % (d // 2)) + c // (d // 2) if permuted else c) for c in range(d) if nonzero[c]))
    return out


def run_channels(model, press, input_ids, permuted):
    from transformers import DynamicCache
    import torch

    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(input_ids, past_key_values=cache, use_cache=True)
    return [channels_kept(cache.layers[l].keys[0], permuted) for l in range(len(model.model.layers))]


def run_press(model, press, input_ids, index, n_head_kv):
    from transformers import DynamicCache
    import torch

    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(input_ids, past_key_values=cache, use_cache=True)
    n = input_ids.shape[1]
    layers = model.model.layers
    # masked_key_indices is reset by kvpress at every prefill (attention_patch sets it to None before the attention
    # when the query is as long as the keys), and by kept_masked after reading; DMSPress leaves it None in a layer
    # where it evicts nothing, so any layer having it means a masking press
    if any(getattr(layer.self_attn, "masked_key_indices", None) is not None for layer in layers):
        return [kept_masked(layer.self_attn, n_head_kv, n) for layer in layers]
    return [kept_pruned(index[l], cache.layers[l].keys[0]) for l in range(len(layers))]


def write_dump(path, header, kept, channels=None):
    with open(path, "w") as f:
        f.write(json.dumps(header) + "\n")
        for l, heads in enumerate(kept):
            for h, pos in enumerate(heads):
                rec = {"when": "prefill", "layer": l, "kv_head": h}
                if channels:  # a channel press keeps every position: its channels only
                    rec["channels"] = channels[l][h]
                else:
                    rec["positions"] = pos
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help=f"one of {', '.join(MODELS)} (its GGUF under {MODEL_DIR}, "
                                                        "prompt, ids and output directory) or a GGUF path")
    ap.add_argument("--prompt", help="default: the model's (MODELS)")
    ap.add_argument("--ids", help="llamacpp_ref.json or a kvbench --dump-kept file (default: the model's)")
    ap.add_argument("--budget", type=float, default=0.3, help="kept fraction (compression_ratio = 1 - budget)")
    ap.add_argument("--out", help="default: the model's fixture directory")
    ap.add_argument("--press", action="append", help="output names to run, repeated or comma-separated "
                                                      "(default: all of press_table)")
    ap.add_argument("--profile", help="kvbench profile with the qfilter and duo sections (default: the model's, "
                                      "under ~/.cache/kvbench/profiles)")
    a = ap.parse_args()
    named = MODELS.get(a.model, MODELS["default"])
    if a.model in MODELS:
        a.model = os.path.join(MODEL_DIR, named["gguf"])
    a.prompt, a.out = a.prompt or named["prompt"], a.out or named["out"]
    a.ids = a.ids or named["ids"]
    if not a.ids:
        sys.exit("--ids: this model has no llama.cpp ids for the prompt: give a kvbench --dump-kept file of it")

    import torch
    import transformers
    from importlib.metadata import version
    from kvpress.utils import compute_n_kept
    from transformers import AutoModelForCausalLM, DynamicCache

    with open(a.prompt, encoding="utf-8") as f:
        text = f.read()
    rec = kvbench_ids(a.ids, a.prompt)
    ids = rec["prompt_ids"]
    model_dir, model_file = os.path.split(os.path.abspath(a.model))
    check_tokenizer(model_dir, model_file, text, ids)

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    cfg = model.config
    if getattr(cfg, "head_dim", None) is None:  # Qwen2Config has none; CriticalKVPress reads it
        cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
    print(f"model: {model_file} ({cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} KV heads) "
          f"loaded in {time.time() - t0:.1f} s")
    input_ids = torch.tensor([ids])
    if named["ref"]:  # the dequantized model (Qwen2: with its q/k/v biases) against llama.cpp on its longest prompt
        with open(named["ref"]) as f:
            ref = max(json.load(f)["prompts"], key=lambda p: p["n_prompt"])
        with torch.no_grad():
            check_logits(model(torch.tensor([ref["prompt_ids"]]), logits_to_keep=1).logits[0, -1], ref)
    # transformers' GGUF loader un-permutes a Llama GGUF's q/k (RoPE pairs (2j, 2j+1) -> (j, j + d/2)); Qwen2's GGUF
    # is in the HF order already: channel indices and key-space vectors are reordered only for the first
    permuted = cfg.model_type in ("llama",)
    t0 = time.time()
    cache = DynamicCache()
    with torch.no_grad():
        out = model(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    check_logits(out.logits[0, -1], rec)
    index = [row_index(k) for k in cached_keys(cache, cfg.num_hidden_layers)]
    print(f"full prefill: {len(ids)} tokens in {time.time() - t0:.1f} s")

    source = f"kvpress {version('kvpress')} (transformers {transformers.__version__}, torch {torch.__version__})"

    def profile():
        """kvbench's calibration profile of the model (~/.cache/kvbench/profiles/<sha256 of the GGUF>.json)"""
        if a.profile:
            path = a.profile
        else:
            import hashlib

            h = hashlib.sha256()
            with open(a.model, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            path = os.path.expanduser(f"~/.cache/kvbench/profiles/{h.hexdigest()}.json")
        if not os.path.exists(path):
            sys.exit(f"{path}: no kvbench profile: run kvbench calibrate qfilter / duo on {a.model} first")
        with open(path) as f:
            return json.load(f)

    table = press_table(round(1 - a.budget, 6), {"n": len(ids), "profile": profile, "permuted": permuted,
                                                 "config": cfg, "out": a.out})
    import kvpress.presses.kvzip_press as kvzip_press

    kvzip_press.AutoTokenizer = kvzip_tokenizer(model_dir, model_file)
    eager = None  # (model, index): the same GGUF with eager attention, for the presses that read attention weights
    os.makedirs(a.out, exist_ok=True)
    for name in [n for p in a.press for n in p.split(",")] if a.press else list(table):
        if name not in table:
            sys.exit(f"--press {name}: not one of {', '.join(table)}")
        method, press, opts, extra = table[name]()
        run_model, run_index = model, index
        if extra.get("attn") == "eager":
            if eager is None:  # eager's hidden states differ from sdpa's in the last bits: its own full prefill
                em = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
                ec = DynamicCache()
                with torch.no_grad():
                    em(input_ids, past_key_values=ec, use_cache=True, logits_to_keep=1)
                eager = (em, [row_index(k) for k in cached_keys(ec, cfg.num_hidden_layers)])
            run_model, run_index = eager
        t0 = time.time()
        torch.manual_seed(0)  # LeverageScorePress draws its sketch from torch.randn: the same draw every run
        channels = None
        if extra.get("channels"):
            channels = run_channels(run_model, press, input_ids, permuted)
            kept = [[list(range(len(ids)))] * cfg.num_key_value_heads for _ in channels]
        else:
            kept = run_press(run_model, press, input_ids, run_index, cfg.num_key_value_heads)
        sizes = [len(p) for heads in kept for p in heads]
        per_layer = [sum(len(p) for p in heads) for heads in kept]
        budget = a.budget
        if extra.get("no_budget"):  # DMSPress: a threshold, no budget
            budget = per_head = None
            evicted = len(sizes) * len(ids) - sum(sizes)
            print(f"{name}: evicted {evicted / (len(sizes) * len(ids)):.4f} of the (layer, head, position) triples, "
                  f"{evicted / (len(sizes) * (len(ids) - 128)):.4f} of those before the window; "
                  f"per layer {[round(1 - k / (cfg.num_key_value_heads * len(ids)), 3) for k in per_layer]}")
        else:
            per_head = extra.get("tokens_per_head") or compute_n_kept(len(ids), press.compression_ratio)
        if per_head == "kept":  # the press's own count, the same in every head
            per_head = sizes[0] if len(set(sizes)) == 1 else sys.exit(f"{name}: heads keep different counts")
        header = {"method": method, "opts": opts, "budget": budget, "n_prompt": len(ids),
                  "tokens_per_head": per_head, "kept_per_layer": per_layer, "source": source,
                  "kvpress_params": press_params(press), "model": model_file, "prompt": a.prompt}
        if channels:
            header["channels_per_head"] = sorted({len(c) for heads in channels for c in heads})
        if "note" in extra:
            header["note"] = extra["note"]
        if "profile" in extra:
            header["profile"] = extra["profile"]
        if method == "pyramidkv" and len(set(per_layer)) == 1:
            header["note"] = ("PyramidKVPress fell back to uniform SnapKV (its top layer would keep "
                              "budget/beta < window tokens): every layer keeps round(budget x n)")
        path = os.path.join(a.out, name + ".jsonl")
        write_dump(path, header, kept, channels)
        print(f"{name}: kept per head min {min(sizes)} mean {sum(sizes) / len(sizes):.1f} max {max(sizes)}, "
              f"{time.time() - t0:.1f} s -> {path}")


if __name__ == "__main__":
    main()
