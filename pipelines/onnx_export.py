"""The one-time ONNX export of a sentence-transformers model (rag.embedding_backend onnx / onnx-int8), run in its own
process (`python -m pipelines.onnx_export MODEL TARGET [--int8]`) so that the gateway serving the exported model never
imports torch, sentence-transformers or transformers (~370 MB of a process's memory, measured in BENCHMARKS.md §2).

The export reads only the model's local files (torch.onnx.export of its Transformer module; mean pooling and
normalising run on numpy in pipelines.embedding); onnx-int8 is the same graph with its weights dynamically quantised
(onnxruntime.quantization). Each file is written under a temporary name and renamed into place, so a process that
finds the target finds it whole."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

NAMES = ["input_ids", "attention_mask", "token_type_ids"]


def export_onnx(path: str, target: Path) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    # its Transformer module; Any: torch types a module's attributes (tokenizer, auto_model) as Tensor | Module
    transformer: Any = SentenceTransformer(path, device="cpu")[0]

    class Encoder(torch.nn.Module):  # the word-piece vectors; pooling and normalising run on numpy
        def __init__(self, model: torch.nn.Module):
            super().__init__()
            self.model: torch.nn.Module = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    sample = transformer.tokenizer(["an example", "a second, longer example"], padding=True, return_tensors="pt")
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        out = Path(scratch) / target.name
        torch.onnx.export(
            Encoder(transformer.auto_model.eval()),
            tuple(sample[n] for n in NAMES),
            str(out),
            input_names=NAMES,
            output_names=["last_hidden_state"],
            opset_version=17,
            dynamo=False,
            dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*NAMES, "last_hidden_state"]},
        )
        os.replace(out, target)


def quantize(plain: Path, target: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        out = Path(scratch) / target.name
        quantize_dynamic(str(plain), str(out), weight_type=QuantType.QInt8)
        os.replace(out, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", help="the sentence-transformers model directory")
    parser.add_argument("target", type=Path, help="the .onnx file to write")
    parser.add_argument("--int8", type=Path, metavar="PLAIN", help="quantise this fp32 export into target instead")
    args = parser.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"  # the model's own files, never a download
    if args.int8 is not None:
        quantize(args.int8, args.target)
    else:
        export_onnx(args.model, args.target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
