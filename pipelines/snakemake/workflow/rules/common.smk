# common.smk: the sample sheet, the VCFs to score, the tool settings and the helpers the rules
# share (functions only: the rules live in tokenize.smk, train.smk, embed.smk and score.smk).
#
# The sample sheet (config["samples"], a TSV with the columns `sample` and `path`; `#` lines
# are comments) is read here and every row validated against schemas/samples.schema.yaml.
# The one thing to know: errors name the sheet and the line, and the workflow stops before
# any job runs.
import csv
import os
import re
import shlex

from snakemake.utils import validate

OUT = config["outdir"]
TOK = config["tokenize"]
TRAIN = config["train"]
EMBED = config["embed"]
SCORE = config["score"]
# The *.val.mtok outputs exist exactly when a validation fraction is asked for.
WITH_VAL = float(TOK["val_fraction"]) > 0


def read_sample_sheet(path):
    """{sample: path} from the TSV sample sheet; ValueError naming the line on bad rows."""
    if not os.path.isfile(path):
        raise ValueError(f"config: samples: no such sample sheet: {path} (a TSV with the "
                         f"columns sample and path; relative to {os.getcwd()})")
    with open(path, newline="") as fh:
        lines = [(n, l) for n, l in enumerate(fh, 1) if l.strip() and not l.startswith("#")]
    reader = csv.DictReader((l for _, l in lines), delimiter="\t")
    if reader.fieldnames != ["sample", "path"]:
        raise ValueError(f"{path}: line {lines[0][0] if lines else 1}: the header must be the "
                         f"two columns 'sample<TAB>path', not {reader.fieldnames}")
    samples = {}
    for (n, _), row in zip(lines[1:], reader):
        if None in row or None in row.values():
            raise ValueError(f"{path}: line {n}: expected 2 tab-separated columns (sample, path)")
        try:
            validate(row, "../schemas/samples.schema.yaml")
        except Exception as e:
            raise ValueError(f"{path}: line {n}: {str(e).splitlines()[0]}") from None
        if row["sample"] in samples:
            raise ValueError(f"{path}: line {n}: sample {row['sample']!r} is listed twice")
        if not os.path.exists(row["path"]):
            raise ValueError(f"{path}: line {n}: sample {row['sample']!r}: no such file: "
                             f"{row['path']} (relative paths are relative to {os.getcwd()})")
        samples[row["sample"]] = row["path"]
    if not samples:
        raise ValueError(f"{path}: the sample sheet lists no samples")
    return samples


SAMPLES = read_sample_sheet(config["samples"])


def read_vcfs(score):
    """{name: path} of score.vcfs, checked with score.fasta and its .fai; ValueError naming
    the config key."""
    vcfs = score.get("vcfs") or {}
    for name, path in vcfs.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"config: score.vcfs: {name!r}: names are letters, digits, '.', "
                             f"'_' and '-' (it names {OUT}/scores/<name>.vcf.gz)")
        if not os.path.exists(path):
            raise ValueError(f"config: score.vcfs: {name}: no such file: {path} (relative "
                             f"paths are relative to {os.getcwd()})")
    fasta = score.get("fasta") or ""
    if vcfs and not fasta:
        raise ValueError("config: score.vcfs needs score.fasta, the reference FASTA the "
                         "variants are on (indexed: samtools faidx)")
    if vcfs and not os.path.exists(fasta):
        raise ValueError(f"config: score.fasta: no such file: {fasta}")
    if vcfs and not os.path.exists(f"{fasta}.fai"):
        raise ValueError(f"config: score.fasta: {fasta} has no index {fasta}.fai (run "
                         f"samtools faidx {fasta}; a gzip FASTA must be bgzip first)")
    return dict(vcfs)


VCFS = read_vcfs(SCORE)


def shell_prefix():
    """Strict bash, and bin_dir (e.g. a checkout's build/) in front of $PATH when it exists."""
    prefix = "set -euo pipefail; "
    bin_dir = config.get("bin_dir") or ""
    if bin_dir and os.path.isdir(bin_dir):
        prefix += f"export PATH={shlex.quote(os.path.abspath(bin_dir))}:\"$PATH\"; "
    return prefix


shell.prefix(shell_prefix())


def train_overrides():
    """key=value words for moe-train, from a string or a mapping in the config."""
    ov = TRAIN.get("overrides") or ""
    if isinstance(ov, dict):
        fmt = lambda v: str(v).lower() if isinstance(v, bool) else str(v)  # YAML true, not True
        return " ".join(shlex.quote(f"{k}={fmt(v)}") for k, v in ov.items())
    return ov


def tokenize_outputs(stem=f"{OUT}/tokens/{{sample}}"):
    """A tokenize job's outputs: the training shard STEM.mtok, and STEM.val.mtok when a
    validation fraction is asked for."""
    out = {"shard": f"{stem}.mtok"}
    if WITH_VAL:
        out["val"] = f"{stem}.val.mtok"
    return out


def tokenize_parts(sample):
    """How many `moe-tokenize --part I/N` jobs tokenize a sample: tokenize.parts when its input
    is larger than tokenize.parts_min_mb megabytes, else 1 (one job for the whole file). SAM
    text (.sam, .sam.gz) is never split: --part refuses it."""
    n = int(TOK["parts"])
    path = SAMPLES[sample]
    big = os.path.getsize(path) > float(TOK["parts_min_mb"]) * 1e6
    sam = re.fullmatch(r".*\.sam(\.gz)?", os.path.basename(path)) is not None
    return n if n > 1 and big and not sam else 1


def sample_regex(names):
    """A wildcard constraint matching exactly these sample names (none: matches nothing)."""
    return "|".join(re.escape(s) for s in names) or "(?!)"


# The samples tokenized in parts and merged, and those tokenized by one job.
SPLIT = [s for s in SAMPLES if tokenize_parts(s) > 1]
WHOLE = [s for s in SAMPLES if s not in SPLIT]
