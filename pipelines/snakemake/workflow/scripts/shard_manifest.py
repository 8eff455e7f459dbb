# shard_manifest.py: the `shard_manifest` rule's script - writes a moe-token-shards manifest
# (docs/formats.md) that lists exactly the rule's declared training and validation shards.
#
# moe-train --data MANIFEST then trains on those shards and validates on those *.val.mtok
# files, whatever else lies in the directory. The one thing to know: manifest paths are plain
# file names relative to the manifest, so every shard must sit in the manifest's directory.
import json
import os
import sys


def entries(paths, manifest_dir):
    """[{"path": name}, ...] for shard paths that lie in manifest_dir; ValueError otherwise."""
    out = []
    for p in paths:
        if os.path.dirname(os.path.abspath(p)) != manifest_dir:
            raise ValueError(f"shard {p} is not in the manifest's directory {manifest_dir}")
        out.append({"path": os.path.basename(p)})
    return out


def main(sm):
    manifest = sm.output[0]
    mdir = os.path.dirname(os.path.abspath(manifest))
    doc = {
        "format": "moe-token-shards",
        "version": 1,
        "shards": entries(sm.input.shards, mdir),
        "val_shards": entries(sm.input.val, mdir),
    }
    with open(manifest, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    with open(sm.log[0], "w") as log:
        print(f"{manifest}: {len(doc['shards'])} shards, {len(doc['val_shards'])} validation "
              f"shards", file=log)


if __name__ == "__main__" or "snakemake" in globals():
    try:
        main(snakemake)  # noqa: F821 (set by Snakemake's script: directive)
    except ValueError as e:
        print(f"shard_manifest: error: {e}", file=sys.stderr)
        sys.exit(2)
