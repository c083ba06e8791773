"""Build the GPU model fixture: a small Gemma-architecture decision model, trained on synthetic underwriting data.

    python3 benchmarks/gpu/build_model.py --out /tmp/model [--train-seconds 90] [--device cuda]

Writes a Hugging Face model directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with a
chat template, generation_config.json) that `vllm serve` loads, plus `arbiter-fixture.json` (labels, codes, steps,
rule-set version, training figures, agreement with the rules on held-out applicants).

- Tokenizer: byte-level BPE trained with `tokenizers` on the synthetic corpus, digits split one by one (so the model
  can compare numbers digit by digit), and every label and reasoning code added as one whole token, so the runtime
  resolves each to a single distinct token id and reads its probability from the log-probabilities.
- Data: `underwriting.py`'s documented rule set, seeded. The prompt is the runtime's prompt for the applicant (taken
  from `arbiter_runtime` when it offers a prompt builder, otherwise the documented default below); the answer is
  the scored-mode answer in the compact format (`CODElabel` per step, the runtime's default), in the lines format
  (`code:label`, one line per step) or the generated-mode trajectory JSON; the system prompt says which, so one
  model serves every format.
- Agreement is measured the way the runtime's scored mode decodes: for each step the most likely reasoning code,
  then the most likely label, each chosen only among the allowed tokens (compact format; lines reported too).

Needs torch, transformers and tokenizers (all on the GPU machine's image). `--device cpu --train-steps 20
--train-size 2000` is a smoke run that finishes in about a minute on a laptop CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prompts
import underwriting as uw

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# Roles as special tokens and an end marker after each message: the model can always tell where the applicant text
# ends, whatever the runtime writes into the messages.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(corpus: list[str], vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    # Whole-word tokens for labels and codes: matched before BPE, so "approved" is always one token, wherever it is.
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in (*uw.CODES, *uw.LABELS)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=SPECIALS[4:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def single_token_ids(tokenizer, words) -> dict[str, int]:
    ids = {}
    for w in words:
        enc = tokenizer.encode(w, add_special_tokens=False)
        if len(enc) != 1:
            raise SystemExit(f"{w!r} is not one token ({enc}); the runtime could not read its probability")
        ids[w] = enc[0]
    if len(set(ids.values())) != len(ids):
        raise SystemExit(f"labels/codes share token ids: {ids}")
    return ids


_SENTINEL = "\x00APPLICANT\x00"
_TEMPLATE_CACHE: dict[tuple[int, str], tuple[str, str]] = {}


def prompt_text(tokenizer, applicant: dict, mode: str) -> str:
    """The chat template applied to the runtime's messages, as vLLM renders it. The template is rendered once per
    mode around a sentinel (rendering Jinja 200k times would take longer than the training)."""
    key = (id(tokenizer), mode)
    if key not in _TEMPLATE_CACHE:
        msgs = prompts.messages(applicant, mode)
        msgs[-1] = {**msgs[-1], "content": _SENTINEL}
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        before, _, after = text.partition(_SENTINEL)
        _TEMPLATE_CACHE[key] = (before, after)
        full = tokenizer.apply_chat_template(prompts.messages(applicant, mode), add_generation_prompt=True,
                                             tokenize=False)
        assert full == before + uw.applicant_text(applicant) + after, "chat template is not a plain wrapper"
    before, after = _TEMPLATE_CACHE[key]
    return before + uw.applicant_text(applicant) + after


def prompt_ids(tokenizer, apps: list[dict], mode: str) -> list[list[int]]:
    """Token ids of the rendered prompts. The template's text before and after the applicant ends and starts with a
    special token, where tokenization always splits, so those parts are encoded once and the applicant alone per
    example (checked against a full encoding)."""
    prompt_text(tokenizer, apps[0], mode)
    before, after = _TEMPLATE_CACHE[(id(tokenizer), mode)]
    pre = tokenizer(before, add_special_tokens=False)["input_ids"]
    post = tokenizer(after, add_special_tokens=False)["input_ids"]
    mid = tokenizer([uw.applicant_text(a) for a in apps], add_special_tokens=False)["input_ids"]
    out = [pre + m + post for m in mid]
    full = tokenizer(prompt_text(tokenizer, apps[0], mode), add_special_tokens=False)["input_ids"]
    assert out[0] == full, "prompt tokenization is not compositional at the special tokens"
    return out


ANSWERS = {"scored": uw.compact_answer, "scored-lines": uw.lines_answer, "generated": uw.trajectory_answer}


def encode_examples(tokenizer, apps: list[dict], rng: random.Random, json_share: float, lines_share: float):
    """(input_ids, labels) per applicant: prompt tokens masked out of the loss, answer + eos trained. Each applicant
    is answered in one format (the system prompt says which): scored compact (the runtime's default), scored lines,
    or generated JSON.

    A scored answer is encoded token by token (each code and label its own added token, nothing else between them
    in the compact format), which is how the model generates it under the runtime's regex."""
    def pick():
        r = rng.random()
        return "generated" if r < json_share else "scored-lines" if r < json_share + lines_share else "scored"

    modes = [pick() for _ in apps]
    eos = tokenizer.eos_token_id
    out = []
    for mode in ANSWERS:
        idx = [i for i, m in enumerate(modes) if m == mode]
        if not idx:
            continue
        sub = [apps[i] for i in idx]
        enc_p = prompt_ids(tokenizer, sub, mode)
        enc_a = tokenizer([ANSWERS[mode](uw.decide(a)) for a in sub], add_special_tokens=False)["input_ids"]
        for p, a in zip(enc_p, enc_a, strict=True):
            out.append((p + a + [eos], [-100] * len(p) + a + [eos]))
    rng.shuffle(out)
    return out


def batches(examples, batch_size: int, pad_id: int, rng: random.Random, torch, device):
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            chunk = [examples[j] for j in order[i : i + batch_size]]
            width = max(len(x[0]) for x in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            lab = torch.full((len(chunk), width), -100, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, (x, y) in enumerate(chunk):
                ids[r, : len(x)] = torch.tensor(x)
                lab[r, : len(y)] = torch.tensor(y)
                mask[r, : len(x)] = 1
            yield (ids.to(device, non_blocking=True), lab.to(device, non_blocking=True),
                   mask.to(device, non_blocking=True))


def scored_decode(model, tokenizer, apps: list[dict], torch, device, batch_size: int = 512, fmt: str = "scored"):
    """Greedy decoding restricted like the runtime's scored mode (fmt "scored": compact, nothing between code and
    label; "scored-lines": `code:label\\n`); returns (steps, label probabilities) per applicant."""
    code_ids = single_token_ids(tokenizer, uw.CODES)
    label_ids = single_token_ids(tokenizer, uw.LABELS)
    lines = fmt == "scored-lines"
    colon = tokenizer.encode(":", add_special_tokens=False) if lines else []
    newline = tokenizer.encode("\n", add_special_tokens=False) if lines else []
    code_list = [code_ids[c] for c in uw.CODES]
    label_list = [label_ids[lab] for lab in uw.LABELS]
    pad = tokenizer.pad_token_id
    results = []
    model.eval()
    for i in range(0, len(apps), batch_size):
        chunk = apps[i : i + batch_size]
        seqs = prompt_ids(tokenizer, chunk, fmt)
        steps = [[] for _ in chunk]
        probs = [[] for _ in chunk]
        for _ in range(uw.STEPS):
            for part in ("code", "label"):
                width = max(len(s) for s in seqs)
                # Left padding, with positions counted from each sequence's own first token (as vLLM sees it).
                ids = torch.full((len(seqs), width), pad, dtype=torch.long)
                mask = torch.zeros((len(seqs), width), dtype=torch.long)
                for r, s in enumerate(seqs):
                    ids[r, width - len(s) :] = torch.tensor(s)
                    mask[r, width - len(s) :] = 1
                ids, mask = ids.to(device), mask.to(device)
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                with torch.no_grad(), torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16,
                                                     enabled=device.startswith("cuda")):
                    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].float()
                if part == "code":
                    pick = logits[:, code_list].argmax(-1).tolist()
                    for r in range(len(seqs)):
                        seqs[r] = seqs[r] + [code_list[pick[r]]] + colon
                        steps[r].append([uw.CODES[pick[r]], None])
                else:
                    p = logits[:, label_list].softmax(-1)
                    pick = p.argmax(-1).tolist()
                    for r in range(len(seqs)):
                        seqs[r] = seqs[r] + [label_list[pick[r]]] + newline
                        steps[r][-1][1] = uw.LABELS[pick[r]]
                        probs[r].append([round(v, 4) for v in p[r].tolist()])
        results.extend(zip(steps, probs, strict=True))
    return results


def agreement(model, tokenizer, apps, torch, device) -> dict:
    """Agreement with the rules, decoded in the compact scored format (the default; the headline figures) and in
    the lines format."""
    n = len(apps)
    out = {"held_out": n, "rule_approve_share": round(sum(uw.decision(a) == uw.APPROVE for a in apps) / n, 4)}
    for fmt, prefix in (("scored", ""), ("scored-lines", "lines_")):
        decoded = scored_decode(model, tokenizer, apps, torch, device, fmt=fmt)
        agree = exact = 0
        for a, (steps, _) in zip(apps, decoded, strict=True):
            want = uw.decide(a)
            agree += steps[-1][1] == want[-1].label
            exact += all(s[0] == w.code and s[1] == w.label for s, w in zip(steps, want, strict=False))
        out[f"{prefix}decision_agreement"] = agree / n
        out[f"{prefix}trajectory_exact"] = exact / n
    return out


def save_tokenizer(tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    # transformers may keep the template only in a side file; keep it in tokenizer_config.json too, where every
    # version of vLLM's tokenizer loading finds it.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--train-size", type=int, default=150_000)
    ap.add_argument("--held-out", type=int, default=2_000)
    ap.add_argument("--train-seconds", type=float, default=90.0)
    ap.add_argument("--train-steps", type=int, default=100_000, help="upper bound; time usually ends training")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--json-share", type=float, default=0.3, help="share of examples answered as trajectory JSON")
    ap.add_argument("--lines-share", type=float, default=0.2, help="share answered in the scored lines format")
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4, help="attention heads; tensor parallel size must divide it")
    ap.add_argument("--kv-heads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch
    from transformers import GemmaConfig, GemmaForCausalLM

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    t0 = time.time()

    # Held-out applicants come from another seed stream, so none of them is in the training data by construction
    # of the generator (a repeat of the exact same four values is possible but rare and harmless).
    train_apps = uw.applicants(args.train_size, args.seed)
    held_apps = uw.applicants(args.held_out, args.seed + 1)
    corpus = []
    for a in train_apps[:5_000]:
        corpus.append(prompts.messages_text(a, "scored"))
        corpus.append(prompts.messages_text(a, "generated"))
        corpus.append(uw.lines_answer(uw.decide(a)))
        corpus.append(uw.trajectory_answer(uw.decide(a)))
    tokenizer = build_tokenizer(corpus, args.vocab_size)
    single_token_ids(tokenizer, (*uw.CODES, *uw.LABELS))
    save_tokenizer(tokenizer, args.out)  # early, so other work (bench_7b.py build) can start before training ends
    examples = encode_examples(tokenizer, train_apps, rng, args.json_share, args.lines_share)
    longest = max(len(x[0]) for x in examples)
    print(f"tokenizer: {len(tokenizer)} tokens; {len(examples)} examples, longest {longest} tokens; "
          f"prep {time.time() - t0:.1f}s", flush=True)

    config = GemmaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    model = GemmaForCausalLM(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    feed = batches(examples, args.batch_size, tokenizer.pad_token_id, rng, torch, device)
    warmup = 100
    model.train()
    start = time.time()
    losses = []
    step = 0
    while step < args.train_steps and time.time() - start < args.train_seconds:
        frac = (time.time() - start) / args.train_seconds
        lr = args.lr * min(1.0, (step + 1) / warmup) * max(0.05, 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, lab, mask = next(feed)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 200 == 0 or step == 1:
            losses.append((step, round(loss.item(), 4)))
            print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} {time.time() - start:.0f}s", flush=True)
    train_s = time.time() - start
    final_loss = loss.item()

    result = agreement(model, tokenizer, held_apps, torch, device)
    result.update(
        {
            "rule_set": "underwriting-v1 (benchmarks/gpu/underwriting.py)",
            "seed": args.seed,
            "labels": list(uw.LABELS),
            "codes": list(uw.CODES),
            "steps": uw.STEPS,
            "prompt_source": prompts.SOURCE,
            "parameters": n_params,
            "train_examples": len(examples),
            "train_steps": step,
            "train_seconds": round(train_s, 1),
            "batch_size": args.batch_size,
            "final_loss": round(final_loss, 4),
            "loss_curve": losses,
            "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
            "torch": torch.__version__,
        }
    )
    print(json.dumps({k: v for k, v in result.items() if k != "loss_curve"}), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    # Saved in bf16 (save_pretrained records the dtype in config.json; vLLM's --dtype=auto then serves bf16).
    model.to(torch.bfloat16).save_pretrained(args.out)
    save_tokenizer(tokenizer, args.out)
    (args.out / "arbiter-fixture.json").write_text(json.dumps(result, indent=2))
    print(f"saved to {args.out} ({sum(f.stat().st_size for f in args.out.iterdir()) / 1e6:.1f} MB) "
          f"in {time.time() - t0:.0f}s", flush=True)
    return 0 if result["decision_agreement"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
