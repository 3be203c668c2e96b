"""Files the tools users already run write, read as datasets: lm-evaluation-harness samples files,
inspect_ai eval logs, Hugging Face save_to_disk folders (grader/io/foreign.py).

Every file here is written by the tool itself, once per module, the tools running side by side:
``lm_eval --log_samples`` with the tiny model through its ``hf`` model type, ``inspect eval`` with
its ``mockllm/model``, ``datasets``' ``save_to_disk``. Wrong-shape files are the only ones made
by hand.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_request

from grader.cli import main
from grader.config import INPUT_SOURCES
from grader.io.dataset import REQUIRED_FIELDS, DatasetError, read_items
from grader.io.foreign import SOURCES
from grader.io.results import read_records
from grader.run.grading import run_grade


def _missing(item):
    """The required fields a row leaves empty (its judge's missing_context)."""
    return [name for name in REQUIRED_FIELDS if not item.fields[name]]


QA = [
    {"qid": "q1", "question": "What is 2+2?", "answer": "4"},
    {"qid": "q2", "question": "Capital of France?", "answer": "Paris"},
    {"qid": "q3", "question": "Water's formula?", "answer": "H2O"},
]

LM_EVAL_TASK = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""
# Two filters: lm-eval writes one line per document and filter.
LM_EVAL_FILTERS = """\
filter_list:
  - name: first
    filter:
      - function: take_first
  - name: lower
    filter:
      - function: lowercase
      - function: take_first
"""

INSPECT_TASK = '''\
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import match
from inspect_ai.solver import generate, system_message


def reply(messages, tools, tool_choice, config):
    # mockllm with an answer that names the question; usage is given, or mockllm counts tokens
    # with tiktoken, which downloads its encoding
    output = ModelOutput.from_content(model="mockllm", content=f"An answer to: {messages[-1].text}")
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


@task
def tiny_qa():
    return Task(
        dataset=[
            Sample(id="q1", input="What is 2+2?", target="4", metadata={"topic": "math"}),
            Sample(id=2, input="Capital of France?", target=["Paris", "paris"]),
            Sample(id="q3", input=[{"role": "user", "content": "Water's formula?"}], target=["H2O"]),
        ],
        solver=[system_message("Answer briefly."), generate()],
        scorer=match(),
        model=get_model("mockllm/model", custom_outputs=reply),
    )
'''

SAVE_TO_DISK = """\
import datasets, sys
rows = [{"id": f"r{i}", "question": f"question {i}", "answer": f"answer {i}",
         "response": f"response {i}", "label": i % 2} for i in range(10)]
features = datasets.Features({"id": datasets.Value("string"), "question": datasets.Value("string"),
                              "answer": datasets.Value("string"), "response": datasets.Value("string"),
                              "label": datasets.ClassLabel(names=["wrong", "right"])})
ds = datasets.Dataset.from_list(rows, features=features)
ds.save_to_disk(sys.argv[1] + "/flat", num_shards=3)
datasets.DatasetDict({"train": ds.select(range(6)), "test": ds.shuffle(seed=0).select(range(4))}
                     ).save_to_disk(sys.argv[1] + "/dict")
datasets.DatasetDict({"test": ds.select([7, 3])}).save_to_disk(sys.argv[1] + "/one")
print(",".join(ds.shuffle(seed=0).select(range(4))["id"]))
"""

MAP_HF = ["--map", "input=question", "--map", "reference=answer", "--map", "output_text=response"]


def _tool(name: str) -> Path:
    return Path(sys.executable).with_name(name)


def _env(home: Path) -> dict[str, str]:
    # offline, and the tools' caches in the test's own directory
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(home / "hf"), "PYTHONWARNINGS": "ignore"}


def _wait(process: subprocess.Popen, what: str) -> str:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, f"{what} failed:\n{err[-3000:]}"
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory, tiny_model) -> dict:
    """Each tool's files, the tools started together (they wait on imports more than on CPU)."""
    root = tmp_path_factory.mktemp("foreign")
    env, started = _env(root), {}
    if importlib.util.find_spec("lm_eval"):
        data = root / "qa.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in QA))
        tasks = root / "tasks"
        tasks.mkdir()
        (tasks / "tiny_qa.yaml").write_text(LM_EVAL_TASK.format(name="tiny_qa", data=data))
        (tasks / "tiny_qa_filters.yaml").write_text(
            LM_EVAL_TASK.format(name="tiny_qa_filters", data=data) + LM_EVAL_FILTERS)
        started["lm-eval"] = subprocess.Popen(
            [str(_tool("lm_eval")), "--model", "hf", "--model_args",
             f"pretrained={tiny_model},dtype=float32", "--tasks", "tiny_qa,tiny_qa_filters",
             "--include_path", str(tasks), "--device", "cpu", "--batch_size", "4",
             "--output_path", str(root / "lm-eval"), "--log_samples"],
            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if importlib.util.find_spec("inspect_ai"):
        (root / "task.py").write_text(INSPECT_TASK)
        for log_format, epochs in (("eval", "2"), ("json", "1")):
            started[log_format] = subprocess.Popen(
                [str(_tool("inspect")), "eval", "task.py", "--log-format", log_format,
                 "--epochs", epochs, "--display", "none", "--log-dir", str(root / log_format)],
                cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if importlib.util.find_spec("datasets"):
        started["hf"] = subprocess.Popen(
            [sys.executable, "-c", SAVE_TO_DISK, str(root / "hf")],
            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found: dict = {}
    for what, process in started.items():
        out = _wait(process, what)
        if what == "lm-eval":
            for file in (root / "lm-eval").rglob("samples_*.jsonl"):
                found["lm-eval-filters" if "_filters_" in file.name else "lm-eval"] = file
        elif what in ("eval", "json"):
            (found[what],) = (root / what).glob(f"*.{what}")
        else:
            found["hf"] = root / "hf"
            found["hf-shuffled"] = out.strip().split(",")
    return found


def _needs(written: dict, *names: str) -> None:
    missing = [n for n in names if n not in written]
    if missing:
        pytest.skip(f"not installed: the tool that writes {', '.join(missing)} (the dev extra)")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _render(*args: str):
    return CliRunner().invoke(main, ["render", *args, "-n", "20", "--format", "seed"])


def _one_line_error(result, path) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), result.stderr
    return lines[0]


def test_the_cli_offers_every_reader():
    assert INPUT_SOURCES == SOURCES


# -- lm-evaluation-harness ---------------------------------------------------------------------


def test_lm_eval_samples_read_target_answer_prompt_and_doc(written):
    _needs(written, "lm-eval")
    path = written["lm-eval"]
    samples = _lines(path)
    items = read_items(str(path))  # detected by its keys, whatever the name
    assert [i.id for i in items] == [s["doc_id"] for s in samples] == [0, 1, 2]
    for item, sample, doc in zip(items, samples, QA):
        assert item.fields["reference"] == doc["answer"]
        # generate_until with the default filter: one text per document
        assert isinstance(sample["filtered_resps"][0], str)
        assert item.fields["output_text"] == sample["filtered_resps"][0].replace("\r\n", "\n") or (
            not sample["filtered_resps"][0].strip() and _missing(item) == ["output_text"])
        assert item.fields["input"] == f"Question: {doc['question']}\nAnswer:"
        assert item.fields["doc.question"] == doc["question"] and item.fields["doc.qid"] == doc["qid"]
        assert item.fields["metric.exact_match"] == sample["exact_match"]
    # the question alone, instead of the prompt
    mapped = read_items(str(path), mapping={"input": "doc.question"})
    assert [i.fields["input"] for i in mapped] == [d["question"] for d in QA]
    assert [i.id for i in read_items(str(path), id_column="doc.qid")] == ["q1", "q2", "q3"]


def test_lm_eval_filters_give_one_row_per_document_and_filter(written):
    _needs(written, "lm-eval")
    path = written["lm-eval-filters"]
    samples = _lines(path)
    items = read_items(str(path))
    assert len(items) == 6
    assert sorted(i.id for i in items) == sorted(f"{d}/{f}" for d in (0, 1, 2) for f in ("first", "lower"))
    for item, sample in zip(items, samples):
        assert item.id == f"{sample['doc_id']}/{sample['filter']}"
        assert item.fields["filter"] == sample["filter"]
        if sample["filter"] == "lower" and item.fields["output_text"]:
            assert item.fields["output_text"] == item.fields["output_text"].lower()


# -- inspect_ai --------------------------------------------------------------------------------


def _inspect_view(items) -> list[tuple]:
    return [(i.id, i.fields["input"], i.fields["reference"], i.fields["output_text"]) for i in items]


INSPECT_ROWS = [
    ("q1", "What is 2+2?", "4"),
    (2, "Capital of France?", '["Paris", "paris"]'),  # a longer list stays a list
    ("q3", "Water's formula?", "H2O"),  # a chat message's text; a list of one, its element
]


def test_inspect_eval_log_one_row_per_sample_and_epoch(written):
    _needs(written, "eval")
    items = read_items(str(written["eval"]))
    assert _inspect_view(items) == [
        (f"{sid}/{epoch}", question, reference, f"An answer to: {question}")
        for sid, question, reference in INSPECT_ROWS for epoch in (1, 2)
    ]
    assert [i.line for i in items] == [1, 2, 3, 4, 5, 6]
    assert items[0].fields["metadata.topic"] == "math"
    assert items[0].fields["score.match"] == "I" and items[1].fields["epoch"] == 2


def test_inspect_json_log_in_the_datasets_order(written):
    _needs(written, "json")
    path = written["json"]
    log = json.loads(path.read_text())
    assert log["eval"]["config"].get("epochs") in (None, 1)
    items = read_items(str(path))
    # one epoch: the sample ids themselves, in the dataset's order whatever order they finished in
    assert _inspect_view(items) == [(sid, q, ref, f"An answer to: {q}") for sid, q, ref in INSPECT_ROWS]


def test_eval_log_rows_are_what_inspect_ais_own_reader_reads(written):
    _needs(written, "eval")
    from inspect_ai.log import read_eval_log_samples

    path = str(written["eval"])
    samples = list(read_eval_log_samples(path, resolve_attachments=True))
    items = read_items(path)
    assert [i.id for i in items] == [f"{s.id}/{s.epoch}" for s in samples]
    for item, sample in zip(items, samples):
        assert item.fields["output_text"] == sample.output.completion
        text = sample.input if isinstance(sample.input, str) else sample.input[-1].text
        assert item.fields["input"] == text
        target = sample.target  # a list of one is its element; a longer one, JSON
        expected = target if isinstance(target, str) else target[0] if len(target) == 1 else None
        assert item.fields["reference"] == (expected or json.dumps(target))


def test_zstd_eval_log_without_zipfile_zstd_names_the_extra(written, tmp_path):
    _needs(written, "eval")
    if sys.version_info >= (3, 14):
        pytest.skip("Python 3.14 reads zstd zip members itself")
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "zipfile_zstd":
                    raise ModuleNotFoundError(name, name=name)
        sys.meta_path.insert(0, Block())
        from grader.cli import main
        main(prog_name="grader")
    """)
    done = subprocess.run([sys.executable, "-c", code, "render", str(written["eval"])],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "pip install 'grader[inspect]'" in done.stderr
    assert done.stderr.startswith(f"error: {written['eval']}: the log is zstd-compressed")
    assert "zipfile-zstd" in done.stderr


# -- Hugging Face save_to_disk -----------------------------------------------------------------


def test_save_to_disk_shards_in_order_with_class_label_names(written):
    _needs(written, "hf")
    items = read_items(str(written["hf"] / "flat"), mapping={"output_text": "response", "reference": "answer"})
    assert [i.id for i in items] == [f"r{i}" for i in range(10)]  # three shards, in order
    assert [i.line for i in items] == list(range(1, 11))
    assert [i.fields["label"] for i in items] == ["wrong", "right"] * 5
    assert items[9].fields["output_text"] == "response 9" and items[9].fields["reference"] == "answer 9"


def test_dataset_dict_reads_a_split_folder_or_its_only_split(written):
    _needs(written, "hf")
    folder = written["hf"]
    assert [i.id for i in read_items(str(folder / "dict" / "test"))] == written["hf-shuffled"]
    assert [i.id for i in read_items(str(folder / "dict" / "train"))] == [f"r{i}" for i in range(6)]
    assert [i.id for i in read_items(str(folder / "one"))] == ["r7", "r3"]
    with pytest.raises(DatasetError) as error:
        read_items(str(folder / "dict"))
    assert str(error.value) == (f"{folder / 'dict'}: a DatasetDict with splits train, test: give one "
                                f"split's folder, e.g. {folder / 'dict' / 'train'}")


def test_save_to_disk_is_read_without_importing_datasets(written, tmp_path):
    _needs(written, "hf")
    code = ("import sys; from grader.io.dataset import read_items; "
            f"assert len(read_items({str(written['hf'] / 'flat')!r})) == 10; "
            "assert 'datasets' not in sys.modules, 'datasets was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# -- grade and render over each ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lm-eval", "eval", "json", "hf"])
def test_grade_and_render_each_file(written, kind, tmp_path, fake_backend_factory):
    _needs(written, kind)
    path = str(written[kind] / "flat") if kind == "hf" else str(written[kind])
    mapping = {"reference": "answer", "output_text": "response", "input": "question"} if kind == "hf" else {}
    expected = [i.id for i in read_items(path, mapping=mapping)]
    out = tmp_path / "results.jsonl"
    forced = {"lm-eval": "lm-eval", "eval": "inspect", "json": "inspect", "hf": "hf-disk"}[kind]
    summary = run_grade(
        *make_request(path, out, mapping=mapping, source=forced),
        backend_factory=fake_backend_factory,
    )
    records = [r for _, r in read_records(out)]
    assert [r.id for r in records] == expected and summary["rows"] == len(expected)
    sent = [c for call in fake_backend_factory.backend.calls for c in call]
    graded = [r for r in records if r.status != "missing_context"]
    assert len(sent) == len(graded) > 0 and all(r.status == "ok" for r in graded)
    # the judge sees the tool's fields: its question and its model's answer
    first = next(i for i in read_items(path, mapping=mapping) if not _missing(i))
    # (the rubric format sends rows grouped by reference, not in input order)
    assert any(first.fields["output_text"] in conversation[-1]["content"] for conversation in sent)
    # render, detected and forced, shows every row's id
    for args in ([path], [path, "--from", forced]):
        result = _render(*args, *(MAP_HF if kind == "hf" else []))
        assert result.exit_code == 0, result.output
        assert [line.split(" (line")[0] for line in result.output.splitlines()
                if line.startswith("===== id ")] == [f"===== id {i!r}" for i in expected]


@pytest.mark.slow
def test_grade_lm_eval_samples_with_the_tiny_model(written, tiny_model, tmp_path):
    """One real run: the CLI, the transformers backend, a file lm_eval wrote."""
    _needs(written, "lm-eval")
    out = tmp_path / "results.jsonl"
    result = CliRunner().invoke(main, [
        "grade", str(written["lm-eval"]), "--model", str(tiny_model), "-o", str(out),
        "--map", "input=doc.question", "--no-checklist", "--format", "seed", "--max-tokens", "96",
        "--limit", "2",
    ])
    assert result.exit_code == 0, result.output
    records = [r for _, r in read_records(out)]
    assert [r.id for r in records] == [0, 1]
    assert all(r.raw_output for r in records if r.status != "missing_context")
    summary = json.loads((tmp_path / "results.summary.json").read_text())
    assert summary["rows"] == 2 and summary["run"]["data"] == str(written["lm-eval"])


# -- files of the wrong shape: one line, exit 2 ------------------------------------------------


def test_plain_jsonl_forced_as_lm_eval_is_one_line(tmp_path):
    data = tmp_path / "plain.jsonl"
    data.write_text('{"id": 1, "reference": "r", "output_text": "o"}\n')
    assert read_items(str(data))[0].id == 1  # detected: plain JSONL
    line = _one_line_error(_render(str(data), "--from", "lm-eval"), data)
    assert line == (f"error: {data}:1: not an lm-evaluation-harness sample: no doc_id, doc, "
                    "target, filtered_resps")


def test_grade_refuses_a_wrong_shape_before_any_model_work(tmp_path, tiny_model):
    data = tmp_path / "plain.jsonl"
    data.write_text('{"id": 1, "reference": "r", "output_text": "o"}\n')
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(main, ["grade", str(data), "--from", "inspect", "--model",
                                       str(tiny_model), "-o", str(out)])
    assert "not a readable inspect_ai .eval log" in _one_line_error(result, data)
    assert not out.exists()


def test_truncated_eval_log_is_one_line(written, tmp_path):
    _needs(written, "eval")
    whole = written["eval"].read_bytes()
    cut = tmp_path / "cut.eval"
    cut.write_bytes(whole[: len(whole) // 2])  # the central directory is at the end: gone
    assert "not a readable inspect_ai .eval log" in _one_line_error(_render(str(cut)), cut)


def test_eval_log_with_a_corrupt_sample_names_its_row(written, tmp_path):
    _needs(written, "eval")
    broken = tmp_path / "broken.eval"
    with zipfile.ZipFile(written["eval"]) as source:
        names = source.namelist()
        with zipfile.ZipFile(broken, "w") as target:
            for name in names:
                data = source.read(name)
                # the second row, in the dataset's order: not JSON any more
                target.writestr(name, b"{" if name == "samples/q1_epoch_2.json" else data)
    line = _one_line_error(_render(str(broken)), broken)
    assert line.startswith(f"error: {broken}:2: "), line


def test_inspect_json_that_is_not_a_log_is_one_line(tmp_path):
    data = tmp_path / "list.json"
    data.write_text("[1, 2]")
    assert _one_line_error(_render(str(data)), data) == (
        f"error: {data}: not an inspect_ai log: no 'eval' object at the top")


def test_save_to_disk_folder_with_a_missing_shard_is_one_line(written, tmp_path):
    _needs(written, "hf")
    folder = tmp_path / "flat"
    folder.mkdir()
    for file in (written["hf"] / "flat").iterdir():
        if file.name != "data-00001-of-00003.arrow":
            (folder / file.name).write_bytes(file.read_bytes())
    line = _one_line_error(_render(str(folder), *MAP_HF), folder)
    assert line == f"error: {folder}: shard data-00001-of-00003.arrow (listed in state.json) is missing"


def test_truncated_arrow_shard_names_its_row(written, tmp_path):
    _needs(written, "hf")
    folder = tmp_path / "flat"
    folder.mkdir()
    for file in (written["hf"] / "flat").iterdir():
        data = file.read_bytes()
        cut = file.name == "data-00002-of-00003.arrow"
        (folder / file.name).write_bytes(data[: len(data) // 2] if cut else data)
    line = _one_line_error(_render(str(folder), *MAP_HF), folder)
    assert line.startswith(f"error: {folder}:8: "), line  # rows 1-7 are in the first two shards


def test_a_folder_that_is_not_save_to_disk_is_one_line(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    assert "not a Hugging Face save_to_disk folder" in _one_line_error(_render(str(folder)), folder)


def test_lm_eval_samples_on_stdin_with_from(written):
    _needs(written, "lm-eval")
    text = written["lm-eval"].read_text()
    result = CliRunner().invoke(main, ["render", "-", "--from", "lm-eval", "-n", "5", "--format",
                                       "seed"], input=text)
    assert result.exit_code == 0, result.output
    assert [line.split(" (line")[0] for line in result.output.splitlines()
            if line.startswith("===== id ")] == ["===== id 0", "===== id 1", "===== id 2"]


def test_from_a_folder_kind_on_stdin_is_one_line():
    result = CliRunner().invoke(main, ["render", "-", "--from", "hf-disk"], input="{}\n")
    assert _one_line_error(result, "-") == "error: -: --from hf-disk reads a file or folder, not stdin"
