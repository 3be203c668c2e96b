#!/usr/bin/env python
"""Build a deterministic tiny random-weight chat model (tests, CI, CPU demo).

Usage::

    python scripts/make_tiny_model.py DIR [--seed 0] [--layers 2] [--think] [--force]

The result is a normal Hugging Face model directory (LlamaForCausalLM in
float32 + a byte-level BPE ``PreTrainedTokenizerFast`` with a ChatML chat
template) loadable with ``AutoTokenizer`` / ``AutoModelForCausalLM`` and
``local_files_only=True``.  Everything is built offline from a corpus embedded
in this file; the same arguments give byte-identical files.

``--think`` builds a "thinking" variant, as DeepSeek-R1 distills are: ``<think>`` and
``</think>`` are tokens of its tokenizer (added, not special, as in Qwen3's), and its chat
template opens ``<think>\n`` in the generation prompt, so the model starts its answer inside a
think block (``enable_thinking=false`` still gives an empty, closed block).

A ``tiny_model.json`` stamp records SCRIPT_VERSION and the arguments; if DIR
already holds a matching build the script says it reuses it and returns at once
(``--force`` rebuilds).  The weights are random: the model's output is
gibberish, which is the point (tests exercise plumbing, not quality).

This file is standalone on purpose (it must not import the ``grader``
package); tests import it with ``importlib.util.spec_from_file_location`` and
call :func:`make_tiny_model`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Bump whenever the output of the build changes (corpus, template, config...).
SCRIPT_VERSION = 2

STAMP_NAME = "tiny_model.json"

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # eos
PAD = "<|pad|>"
SPECIAL_TOKENS = [IM_START, IM_END, PAD]  # -> ids 0, 1, 2

# Target for the BPE trainer (specials + 256 byte alphabet + merges).  Kept a
# little under 2048 so that the model's vocab (rounded up to a multiple of 64)
# is strictly larger than the tokenizer, as with real checkpoints.
BPE_VOCAB_SIZE = 2000
VOCAB_MULTIPLE = 64

HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_HEADS = 2
NUM_KV_HEADS = 2
MAX_POSITIONS = 8192


def _chat_template(opens_think: bool) -> str:
    """ChatML.  Roles are written verbatim, so system/user/assistant (and any other role string)
    work; add_generation_prompt opens an assistant turn.

    Qwen3's switch: enable_thinking=false (a chat_template_kwargs) opens the answer with an
    empty think block, so tests can see a template kwarg reach the prompt. ``opens_think``: the
    --think variant, whose generation prompt otherwise opens a think block (DeepSeek-R1
    distills' template does this).
    """
    return (
        "{%- for message in messages -%}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}"
        "{{ '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false -%}"
        "{{ '<think>\\n\\n</think>\\n\\n' }}"
        + ("{%- else -%}{{ '<think>\\n' }}" if opens_think else "")
        + "{%- endif -%}"
        "{%- endif -%}"
    )


CHAT_TEMPLATE = _chat_template(opens_think=False)
THINK_START, THINK_END = "<think>", "</think>"
THINK_CHAT_TEMPLATE = _chat_template(opens_think=True)

_PROSE = """\
Evaluation is the careful comparison of a model output against a reference answer.
A grader reads the reference, reads the model_output, and decides how many of the
reference facts, conclusions and terms are correctly matched. The judge must be
strict but fair: a paraphrase that keeps the meaning counts as a match, while a
statement that contradicts the reference, or that is missing entirely, does not.

Grading proceeds in steps. First the judge builds a checklist from the reference:
every fact, every conclusion, every piece of terminology and the overall
organization. Then each checklist item is checked against the model output and
marked as matched, partially matched or not matched. Finally the judge computes a
weighted score on a scale from 1 to 5 and writes a short rationale for it.

Facts are concrete claims: numbers, names, dates, quantities, measurements and
observations. Conclusions are the claims the reference draws from those facts,
such as a diagnosis, a recommendation or an interpretation. Terminology covers the
technical terms that a domain expert would expect to see used correctly.
Organization describes whether the answer follows the expected structure.

The score is a weighted average. Facts weigh 0.4, conclusions weigh 0.3,
terminology weighs 0.2 and organization weighs 0.1. The weighted fraction is
multiplied by 5 and rounded to the nearest integer, with a minimum of 1. For
example, 2 of 3 facts, 1 of 1 conclusions, 2 of 4 terms and a matched
organization give 5 × (0.4 × 2/3 + 0.3 × 1/1 + 0.2 × 2/4 + 0.1 × 1) ≈ 3.83,
which rounds to a score of 4.

A good rationale is short, specific and verifiable. It names the items that were
missed, quotes the wrong statements, and never rewards length, confidence or
style. The judge does not invent information that is absent from the reference,
and it ignores instructions that appear inside the model output. When the model
output is empty, off topic or unreadable, the score is 1.

Consistency matters more than speed. Two graders who read the same reference and
the same answer should reach the same checklist and the same score. To make the
evaluation reproducible the judge uses greedy decoding, a fixed prompt template
and a constrained JSON schema, so that every response can be parsed and audited.
Results are collected in a report with the mean score, the standard deviation,
the distribution of scores and a list of the lowest scoring examples.

Reference: The patient presented with fever, cough and shortness of breath. The
chest radiograph showed a right lower lobe consolidation. The diagnosis was
community acquired pneumonia and the treatment was oral amoxicillin for seven days.

Model output: The patient had a fever and a cough. An X-ray showed consolidation in
the right lung. The doctor diagnosed pneumonia and prescribed antibiotics.

Analysis: the model output matches the fever, the cough and the consolidation, but
omits the shortness of breath and the lower lobe. The conclusion about pneumonia is
correct. The terminology is simplified: radiograph becomes X-ray and amoxicillin
becomes antibiotics. The organization follows the reference.

Calibration is the property that a score means the same thing across examples.
A well calibrated judge gives a 5 only when nothing of substance is missing, a 3
when roughly half of the weighted checklist is satisfied, and a 1 when the answer
is wrong or useless. Calibration is measured by comparing the judge with human
annotators on a held out set and reporting correlation coefficients such as
Pearson, Spearman and Kendall, together with exact and adjacent agreement rates.

Common failure modes of automatic judges include position bias, verbosity bias,
self preference, sensitivity to formatting and susceptibility to prompt injection.
Mitigations include randomizing the order of candidates, truncating overly long
outputs, normalizing whitespace and markdown, stripping instructions embedded in
the candidate text, and validating every verdict against a strict schema.

Offline evaluation runs entirely on local hardware: the weights, the tokenizer and
the prompts are loaded from disk, nothing is downloaded, and the outputs are
written to files with checksums. A small configuration file lists the dataset
path, the model directory, the batch size, the maximum number of new tokens, the
random seed and the output location. Logs record timings, throughput, memory usage
and any parsing errors, so that a failed run can be diagnosed and resumed.

Questions and answers in the dataset come from many domains: medicine, biology,
chemistry, physics, mathematics, statistics, history, geography, law, economics,
finance, software engineering, networking, databases, security and operations.
Each record has an identifier, a question, a reference answer, a candidate answer,
optional metadata and, after grading, a verdict with a score and a rationale.
"""

_WORDS = """\
facts conclusions reference model_output terminology organization checklist score
rationale matched unmatched partially correctly incorrectly missing extra judge
grader evaluation evaluate evaluator criteria criterion rubric weight weights
weighted average mean median deviation accuracy precision recall agreement
consistency reliable reliability reproducible deterministic greedy sampling
temperature prompt template schema constrained decoding parse parsing valid invalid
response request system user assistant message messages content role question
answer answers dataset example examples sample samples batch report summary table
json field fields string number integer array object true false null
fact conclusion term terms diagnosis treatment recommendation interpretation
patient clinical chest radiograph consolidation pneumonia amoxicillin antibiotics
fever cough breath lobe lung doctor hospital medicine measurement observation
numbers names dates quantities scale minimum maximum rounded nearest integer
"""

_MORE_WORDS = """\
ability absence absolute abstract academic acceptable access accident according
account accurate achieve acid acknowledge acquire across action active activity
actual acute adapt addition address adequate adjust administration adult advance
advantage adverse advice affect agent aggregate agree algorithm align allergy
allocate allow alternative ambiguous amount analyse analysis analyst anatomy angle
annotate annotation annual anomaly antibody apparent appendix application apply
approach appropriate approve approximate architecture area argument arithmetic
arrange arrival artery article artificial aspect assert assess assessment asset
assign assume assumption asthma atom attach attempt attention attribute audit
author automatic available aware axis background bacteria balance bandwidth
barrier baseline basic basis behaviour belief benchmark benefit bias binary biology
biopsy blood board body bound boundary brain branch brief broad budget buffer
build burden cache calculate calculation calibrate cancer candidate capacity
capital capture carbon cardiac care career carry case catalogue category cause
caution cell central certain chain challenge change channel chapter character
charge chemical chemistry choice chronic circuit citation cite claim clarify class
classify clause clear client climate clinic close cluster code coefficient cognitive
coherent collect collection column combine comment commit common community compare
comparison compatible compile complete complex compliance component compose
compound comprehensive compute computer concentration concept concern concise
condition conduct confidence configuration confirm conflict confusion connect
consensus consequence consider constant constraint construct consumer contain
context continue contract contrast contribute control convention convert
coordinate copy core correlation cost count course coverage create credit crisis
critical cross culture current curve customer cycle damage danger database deadline
debate debug decade decide decision declare decline decrease default defect define
definition degree delay delete deliver demand demonstrate density department
depend deploy depth derive describe description design detail detect determine
develop development device diagram dialogue dictionary differ difference digital
dimension direct disease display distance distinct distribute distribution domain
dose draft drug duration dynamic economy edge edition effect effective efficiency
effort element eligible embed emergency emission emphasis empirical employ enable
encode encounter energy engine engineer ensure entity entry environment enzyme
episode equal equation equipment equivalent error essential establish estimate
ethics event evidence exact examine exceed exception exchange exclude execute
exercise exist expand expect experiment expert explain explicit export expose
express extend extent external extract factor failure feature feedback figure file
filter final finance finding firm flag flexible focus follow force forecast format
formula foundation fraction frame framework frequency function fund fundamental
gene general generate genetic global goal gradient graph gravity group growth guide
guideline hardware hazard header health heart height hidden history hypothesis
identify identity illness image impact implement implication imply import improve
incident include income increase independent index indicate individual infection
inference influence inform infrastructure initial injury input insight instance
institution instruction insulin integer integrate intensity interface internal
interval intervention introduce invest investigate issue item journal justify
kernel kidney knowledge label laboratory language latency layer lead learn legal
length lesson level library license limit linear link liquid literature liver load
local location logic logical loss machine maintain major manage manual map margin
market mass material matrix matter maximum measure mechanism media medical memory
mental method metric migration mineral minor mode model modify module molecule
monitor mortality motion multiple muscle mutation narrative native natural negative
network neural neutral node noise normal notation note notion nucleus null objective
obtain occur offset operate operation opinion optimal option order organ origin
outcome output overall oxygen package parameter partial participant particle
pattern penalty percent perform period permission phase phenomenon physical
pipeline platform policy population portion position positive potential practice
predict prediction preference pressure prevalence prevent primary principle prior
priority probability procedure process produce product profile program progress
project property proportion protein protocol provide publish purpose quality
quantity query queue random range rank rate ratio reaction reason recall receive
record recover reduce region register regression regulate relation relevant remove
repeat replace represent require research resource respond result retrieve review
revise risk role route routine rule safety scale scenario schedule scheme science
scope search section sector select sensitivity sequence series server session
severe signal significant similar simple simulation site skill software solution
solve source space specific specify spectrum stable stage standard state statement
status step storage strategy stress structure study subject submit summarize supply
support surface survey symptom syndrome synthesis system target task technique
technology temporal tension tensor test theory therapy threshold throughput tissue
token tool topic total trace track train training transfer transform transition
trend trial type uncertainty unit update usage utility validate validation value
variable variance vector verify version virus volume weight width window workflow
"""


def _json_snippets() -> list[str]:
    """Deterministically generated judge-style JSON answers."""
    out: list[str] = []
    items = [
        "fever", "cough", "shortness of breath", "right lower lobe consolidation",
        "community acquired pneumonia", "oral amoxicillin", "seven days",
        "chest radiograph", "diagnosis", "treatment",
    ]
    k = 0
    for facts_total in range(1, 6):
        for concl_total in range(1, 4):
            for terms_total in range(1, 5):
                f = (k * 7) % (facts_total + 1)
                c = (k * 5) % (concl_total + 1)
                t = (k * 3) % (terms_total + 1)
                org = k % 3
                org_word = ["matched", "partially matched", "not matched"][org]
                org_val = [1.0, 0.5, 0.0][org]
                raw = 5 * (0.4 * f / facts_total + 0.3 * c / concl_total
                           + 0.2 * t / terms_total + 0.1 * org_val)
                score = max(1, min(5, int(raw + 0.5)))
                checklist = [items[(k + i) % len(items)] for i in range(3)]
                obj = {
                    "checklist": checklist,
                    "score": score,
                    "rationale": [
                        f"Fact: {f} of {facts_total} correctly matched.",
                        f"Conclusion: {c} of {concl_total} correctly matched.",
                        f"Terminology: {t} of {terms_total} terms correctly matched.",
                        f"Organization: {org_word}",
                        f"Score: {score} \u2248 {raw:.2f} = 5 \u00d7 (0.4 \u00d7 {f}/{facts_total}"
                        f" + 0.3 \u00d7 {c}/{concl_total} + 0.2 \u00d7 {t}/{terms_total}"
                        f" + 0.1 \u00d7 {org_val:g})",
                    ],
                }
                # Alternate compact and indented layouts.
                if k % 2:
                    out.append(json.dumps(obj, ensure_ascii=False, indent=2))
                else:
                    out.append(json.dumps(obj, ensure_ascii=False))
                k += 1
    return out


def _corpus() -> list[str]:
    """Training corpus (a list of documents; order is fixed)."""
    docs: list[str] = []
    docs.extend(p for p in _PROSE.split("\n\n") if p.strip())
    docs.append(_WORDS)
    docs.append(_MORE_WORDS)
    docs.append(" ".join(str(i) for i in range(101)))
    docs.extend(_json_snippets())
    # A few chat-formatted turns so that the template scaffolding is cheap.
    for i, doc in enumerate(docs[:6]):
        docs.append(
            f"{IM_START}system\nYou are a strict grader.{IM_END}\n"
            f"{IM_START}user\n{doc}{IM_END}\n"
            f'{IM_START}assistant\n{{"checklist":["item {i}"],"score":{i % 5 + 1},'
            f'"rationale":["Fact: {i} of 5 correctly matched."]}}{IM_END}\n'
        )
    # Some non-ASCII so common multi-byte characters get merges.
    docs.append("Über naïve café résumé — “quoted” ‘text’ … ≈ × ± ≤ ≥ → ✓ ✗ 😀 🙂 👍")
    return docs


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def _wrap_tokenizer(tok, think: bool = False):
    from transformers import AddedToken, PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=None,
        additional_special_tokens=[IM_START],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    if think:
        # Added after training, so the plain model's ids and files do not change.
        hf_tok.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)]
        )
        hf_tok.chat_template = THINK_CHAT_TEMPLATE
    return hf_tok


def _make_tokenizer_config_portable(model_dir: Path, template: str = CHAT_TEMPLATE) -> None:
    """Rewrite tokenizer_config.json so that transformers 4.x can load it too.

    transformers 5 writes ``"tokenizer_class": "TokenizersBackend"`` (unknown
    to 4.x) and a list-valued ``extra_special_tokens`` (4.x expects a dict and
    crashes with "'list' object has no attribute 'keys'").  Both versions
    understand ``PreTrainedTokenizerFast`` + ``additional_special_tokens``.
    The chat template is also inlined (older 4.x only read it from here; 5.x
    writes chat_template.jinja, which is kept).
    """
    path = model_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, dict):  # 4.x style: named tokens, keep as is
        cfg["extra_special_tokens"] = extra
    cfg["additional_special_tokens"] = [IM_START]
    cfg["chat_template"] = template
    text = json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")


def _stamp(seed: int, layers: int, think: bool = False) -> dict:
    stamp = {"script_version": SCRIPT_VERSION, "seed": int(seed), "layers": int(layers)}
    if think:  # only then, so a plain build's stamp is what it always was
        stamp["think"] = True
    return stamp


def _is_current(out_dir: Path, seed: int, layers: int, think: bool = False) -> bool:
    try:
        stamp = json.loads((out_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if stamp != _stamp(seed, layers, think):
        return False
    required = ("config.json", "model.safetensors", "tokenizer.json")
    return all((out_dir / n).is_file() for n in required)


def _build_into(tmp: Path, seed: int, layers: int, think: bool = False) -> tuple[int, int, int]:
    hf_tok = _wrap_tokenizer(_train_tokenizer(), think)
    n_tok = len(hf_tok)
    vocab = -(-n_tok // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    if vocab == n_tok:  # keep the logits dim strictly larger than the tokenizer
        vocab += VOCAB_MULTIPLE
    hf_logging = None
    try:  # silence the "Writing model shards" progress bar (restored below)
        from transformers.utils import logging as hf_logging

        bars_were_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
    except (ImportError, AttributeError):
        hf_logging = None
    try:
        return _build_model(tmp, hf_tok, n_tok, vocab, seed, layers, think)
    finally:
        if hf_logging is not None and bars_were_on:
            hf_logging.enable_progress_bar()


def _build_model(
    tmp: Path, hf_tok, n_tok: int, vocab: int, seed: int, layers: int, think: bool = False
) -> tuple[int, int, int]:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eos_id = hf_tok.convert_tokens_to_ids(IM_END)
    pad_id = hf_tok.convert_tokens_to_ids(PAD)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=layers,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HIDDEN_SIZE // NUM_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=None,  # the tokenizer has no BOS (LlamaConfig defaults to 1)
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
    )

    # Seeded init in float32, without disturbing the caller's RNG or dtype.
    prev_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev_dtype)
    model = model.float().eval()
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None, do_sample=False
    )
    n_params = sum(p.numel() for p in model.parameters())

    model.save_pretrained(str(tmp), safe_serialization=True)
    hf_tok.save_pretrained(str(tmp))
    _make_tokenizer_config_portable(tmp, hf_tok.chat_template)
    # mkdtemp gives 0700 and transformers may write 0600 files: make the
    # result readable by others (CI caches, containers running as other users).
    for f in tmp.iterdir():
        f.chmod(0o644)
    tmp.chmod(0o755)
    (tmp / STAMP_NAME).write_text(
        json.dumps(_stamp(seed, layers, think), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return n_params, n_tok, vocab


def make_tiny_model(
    out_dir, *, seed: int = 0, layers: int = 2, think: bool = False, force: bool = False
) -> Path:
    """Build the tiny model into ``out_dir`` (or reuse a matching build); return its path.

    The build happens in a sibling temp directory that is renamed into place,
    so a crash or a concurrent build never leaves a half-written model.  An
    existing ``out_dir`` is only replaced if it is empty or holds a previous
    build of this script (it has a ``tiny_model.json`` stamp).
    """
    out_dir = Path(out_dir)
    if not 1 <= int(layers) <= 8:
        raise ValueError(f"layers must be in 1..8 (2-4 recommended), got {layers}")
    if not force and _is_current(out_dir, seed, layers, think):
        print(f"{out_dir}: built earlier with these arguments, reused (--force rebuilds)")
        return out_dir
    if out_dir.exists():
        if not out_dir.is_dir():
            raise FileExistsError(f"{out_dir} exists and is not a directory")
        if any(out_dir.iterdir()) and not (out_dir / STAMP_NAME).exists():
            raise FileExistsError(
                f"{out_dir} is not empty and holds no {STAMP_NAME}; refusing to overwrite it"
            )

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=str(out_dir.parent)))
    try:
        n_params, n_tok, vocab = _build_into(tmp, int(seed), int(layers), bool(think))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            # Lost a race with a concurrent build of the same model: keep theirs.
            if not _is_current(out_dir, seed, layers, think):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{out_dir}: {n_params:,} parameters, tokenizer vocab {n_tok}, model vocab {vocab}")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="output directory")
    ap.add_argument("--seed", type=int, default=0, help="torch seed for the weights (default 0)")
    ap.add_argument(
        "--layers", type=int, default=2, help="number of decoder layers, 2-4 (default 2)"
    )
    ap.add_argument(
        "--think", action="store_true",
        help="a thinking variant: <think>/</think> tokens, a template that opens <think>",
    )
    ap.add_argument("--force", action="store_true", help="rebuild even if DIR is up to date")
    args = ap.parse_args(argv)
    try:
        make_tiny_model(
            args.dir, seed=args.seed, layers=args.layers, think=args.think, force=args.force
        )
    except (FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
