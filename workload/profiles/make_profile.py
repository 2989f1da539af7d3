#!/usr/bin/env python3
"""Writes a commsched model profile (see README.md in this folder) for any torch model.

Sizes come from the real model definition (torchvision for CNNs; BERT and Transformer are built here from their
published configurations with plain torch.nn modules, which have exactly the published parameter shapes).

Times: the per-module compute times are one of
  --total-ms T        a given forward+backward time for one iteration (e.g. from published GPU throughput), split
                      across modules in proportion to their FLOPs; backward = 2x forward (the usual rule: gradient
                      w.r.t. inputs and w.r.t. weights each cost about one forward);
  --tflops X          total time from the model's FLOPs at an achieved X TFLOP/s, split the same way;
  --measure           forward and backward of each module timed here with torch on the CPU, then scaled so the sum
                      matches --total-ms when given (keeps the measured shape, uses the published scale).

Examples:
  make_profile.py vgg16 --batch 32 --total-ms 139.7 --device "V100 (published)" -o vgg16.json
  make_profile.py bert-base --batch 32 --seq 128 --total-ms 398 -o bert-base.json
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn


# ---------------------------------------------------------------------------------------------------------------
# Models not in torchvision: BERT (Devlin et al. 2019, Table/appendix configs) and Transformer-base (Vaswani 2017).

class BertLayer(nn.Module):
    def __init__(self, hidden, heads, inter):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden)
        self.intermediate = nn.Linear(hidden, inter)
        self.output = nn.Linear(inter, hidden)
        self.out_norm = nn.LayerNorm(hidden)

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads

        def split(t):
            return t.view(b, s, self.heads, d).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5, dim=-1) @ v
        x = self.attn_norm(x + self.attn_out(att.transpose(1, 2).reshape(b, s, h)))
        return self.out_norm(x + self.output(torch.nn.functional.gelu(self.intermediate(x))))


class Bert(nn.Module):
    """BertModel (embeddings, encoder, pooler) with the published shapes; vocab 30522, 512 positions, 2 types."""

    def __init__(self, layers, hidden, heads, vocab=30522, positions=512):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.emb_norm = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, 4 * hidden) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.word_embeddings(ids) + self.position_embeddings(pos) + self.token_type_embeddings(ids * 0)
        x = self.emb_norm(x)
        for layer in self.layers:
            x = layer(x)
        return torch.tanh(self.pooler(x[:, 0]))


class TiedProjection(nn.Module):
    """The softmax projection that reuses the embedding matrix (one gradient, counted once, under the embedding)."""

    def __init__(self, embedding):
        super().__init__()
        self.weight = embedding.weight
        self.in_features = embedding.embedding_dim

    def forward(self, y):
        return y @ self.weight.t()


class TransformerBase(nn.Module):
    """Transformer-base: d_model 512, 8 heads, FFN 2048, 6+6 layers, one shared 37000-token BPE embedding (WMT En-De)."""

    def __init__(self, vocab=37000, d_model=512):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)  # shared by encoder, decoder and the softmax projection
        self.transformer = nn.Transformer(d_model, 8, 6, 6, 2048, dropout=0.0, batch_first=True)
        self.generator = TiedProjection(self.embedding)

    def forward(self, ids):
        x = self.embedding(ids)
        return self.generator(self.transformer(x, x))


def build_model(name):
    import torchvision.models as tvm
    builtin = {
        "bert-base": lambda: Bert(12, 768, 12),
        "bert-large": lambda: Bert(24, 1024, 16),
        "transformer-base": lambda: TransformerBase(),
    }
    if name in builtin:
        return builtin[name](), "tokens"
    if not hasattr(tvm, name):
        sys.exit(f"make_profile: unknown model '{name}' (torchvision name, or one of {sorted(builtin)})")
    return getattr(tvm, name)(weights=None), "image"


def example_input(kind, seq):
    if kind == "tokens":
        return torch.randint(0, 1000, (1, seq))
    return torch.randn(1, 3, 224, 224)


# ---------------------------------------------------------------------------------------------------------------
# FLOPs per module (multiply-add = 2 FLOPs), measured on one sample through forward hooks.

def module_flops(module, inputs, output):
    out = output[0] if isinstance(output, tuple) else output
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        return 2 * out.numel() * (module.in_channels // module.groups) * kh * kw
    if isinstance(module, (nn.Linear, TiedProjection)):
        return 2 * out.numel() * module.in_features
    if isinstance(module, nn.MultiheadAttention):
        q = inputs[0]
        e, s = module.embed_dim, q.shape[1]
        # in/out projections plus the two attention matmuls (QK^T and AV)
        return 2 * s * e * 4 * e + 2 * 2 * s * s * e
    # norms, embeddings (lookups): about a few operations per output element
    return 4 * out.numel() if torch.is_tensor(out) else 0


# Modules that use their children's parameters functionally (MultiheadAttention calls out_proj's weight directly, so
# out_proj's own hooks never fire): they own all their parameters, recursively.
WHOLE_OWNERS = (nn.MultiheadAttention,)


def owner_modules(model):
    """Modules whose parameters form one 'layer', with their parameters in definition order."""
    owners, inside = [], set()
    for m in model.modules():
        if id(m) in inside:
            continue
        if isinstance(m, WHOLE_OWNERS):
            inside.update(id(c) for c in m.modules())
            owners.append((m, list(m.parameters())))
        elif any(True for _ in m.parameters(recurse=False)):
            owners.append((m, list(m.parameters(recurse=False))))
    return owners


def trace_modules(model, x):
    """Parameter-owning modules in the order they first execute, with their FLOPs."""
    order, flops = [], {}

    def hook(mod, inp, out):
        if id(mod) not in flops:
            order.append(mod)
            flops[id(mod)] = 0
        flops[id(mod)] += module_flops(mod, inp, out)
    hooks = [m.register_forward_hook(hook) for m, _ in owner_modules(model)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return order, flops


def measure_modules(model, x, order, params_of, reps):
    """CPU forward/backward seconds per module (the shape of the time profile, to be scaled).

    Forward: module pre/post hooks. Backward: a gradient hook on each module's parameters stamps when autograd reaches
    it; a module's backward is the time since the previous stamp (parameter-free work in between is counted with the
    next module, as in the FLOP split). Works on torch 1.13, which has no backward pre-hooks."""
    fwd, bwd, start, hooks = {}, {}, {}, []
    for m in order:
        hooks.append(m.register_forward_pre_hook(lambda mod, inp: start.__setitem__(id(mod), time.perf_counter())))
        hooks.append(m.register_forward_hook(
            lambda mod, inp, out: fwd.__setitem__(id(mod), fwd.get(id(mod), 0) + time.perf_counter() - start[id(mod)])))
    stamps = []
    for m in order:
        for p in params_of[id(m)]:
            if p.requires_grad:
                hooks.append(p.register_hook(lambda g, key=id(m): stamps.append((key, time.perf_counter()))))
    for _ in range(reps):
        stamps.clear()
        out = model(x)
        t0 = time.perf_counter()
        out.float().sum().backward()
        seen, last = set(), t0
        for key, t in stamps:
            if key not in seen:  # the module's first gradient: autograd has reached it
                seen.add(key)
                bwd[key] = bwd.get(key, 0) + t - last
                last = t
    for h in hooks:
        h.remove()
    return {k: v / reps for k, v in fwd.items()}, {k: v / reps for k, v in bwd.items()}


# ---------------------------------------------------------------------------------------------------------------

def dtype_name(t):
    return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}[t]


def build_profile(args):
    model, kind = build_model(args.model)
    x = example_input(kind, args.seq)
    order, flops = trace_modules(model, x)
    params_of = {id(m): ps for m, ps in owner_modules(model)}
    if args.measure:
        fwd_s, bwd_s = measure_modules(model, x, order, params_of, args.reps)
        fwd = [fwd_s.get(id(m), 0.0) * 1e3 * args.batch for m in order]
        bwd = [bwd_s.get(id(m), 0.0) * 1e3 * args.batch for m in order]
    else:
        fwd = [float(flops[id(m)]) for m in order]
        bwd = [2.0 * f for f in fwd]
    total_ms = args.total_ms
    if args.tflops:  # achieved throughput: forward + backward = 3x the forward FLOPs of the whole batch
        total_ms = 3.0 * sum(flops.values()) * args.batch / (args.tflops * 1e12) * 1e3
    if total_ms:
        scale = total_ms / (sum(fwd) + sum(bwd))
        fwd = [f * scale for f in fwd]
        bwd = [b * scale for b in bwd]

    tensors, seen = [], set()
    for layer, m in enumerate(order):
        if all(id(p) in seen for p in params_of[id(m)]):
            # only shared weights (a tied projection): its compute belongs to the module that ran just before it
            last = next(t for t in reversed(tensors) if t["forward_ms"] or t["backward_ms"])
            last["forward_ms"] = round(last["forward_ms"] + fwd[layer], 5)
            last["backward_ms"] = round(last["backward_ms"] + bwd[layer], 5)
            continue
        first = True
        for p in params_of[id(m)]:
            if id(p) in seen:  # shared weights (tied embeddings) are one gradient
                continue
            seen.add(id(p))
            full = next(n for n, q in model.named_parameters() if q is p)
            tensors.append({"name": full, "layer": layer, "dtype": dtype_name(p.dtype), "elements": p.numel(),
                            "forward_ms": round(fwd[layer], 5) if first else 0.0,
                            "backward_ms": round(bwd[layer], 5) if first else 0.0})
            first = False
    missing = {n for n, p in model.named_parameters()} - {t["name"] for t in tensors}
    if missing:
        sys.exit(f"make_profile: parameters never used in forward: {sorted(missing)[:5]}")
    return {"name": args.name or args.model, "source": args.source, "batch_size": args.batch,
            "device": args.device, "tensors": tensors}


def write_profile(profile, f):
    """JSON with one tensor per line: diffable and still easy to read."""
    head = {k: v for k, v in profile.items() if k != "tensors"}
    f.write(json.dumps(head, indent=1)[:-2] + ',\n "tensors": [\n')
    f.write(",\n".join("  " + json.dumps(t) for t in profile["tensors"]))
    f.write("\n ]\n}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="torchvision model name, or bert-base, bert-large, transformer-base")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--name", help="profile name (default: the model name)")
    ap.add_argument("--batch", type=int, default=32, help="per-worker batch size the times refer to")
    ap.add_argument("--seq", type=int, default=128, help="sequence length for token models")
    ap.add_argument("--total-ms", type=float, help="forward+backward ms per iteration to split/scale to")
    ap.add_argument("--tflops", type=float, help="achieved TFLOP/s; total time = 3 x forward FLOPs x batch / this")
    ap.add_argument("--measure", action="store_true", help="time modules on this CPU instead of counting FLOPs")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="device the times describe")
    ap.add_argument("--source", default="", help="how sizes and times were obtained (stored in the profile)")
    args = ap.parse_args()
    if not args.measure and not args.total_ms and not args.tflops:
        ap.error("give --total-ms or --tflops (FLOP-proportional split) or --measure")
    profile = build_profile(args)
    with open(args.output, "w") as f:
        write_profile(profile, f)
    n = sum(t["elements"] for t in profile["tensors"])
    ms = sum(t["forward_ms"] + t["backward_ms"] for t in profile["tensors"])
    print(f"{args.output}: {len(profile['tensors'])} tensors, {n / 1e6:.2f} M parameters, {ms:.1f} ms/iteration")


if __name__ == "__main__":
    main()
