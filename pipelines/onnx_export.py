"""The one-time ONNX export of a sentence-transformers model (rag.embedding_backend onnx / onnx-int8), run in its own
process (`python -m pipelines.onnx_export MODEL TARGET [--int8]`) so that the gateway serving the exported model never
imports torch, sentence-transformers or transformers (~370 MB of a process's memory, measured in BENCHMARKS.md §2).

The export reads only the model's local files (torch.onnx.export of its Transformer module; mean pooling and
normalising run on numpy in pipelines.embedding). The module is exported with eager attention, a graph that
onnxruntime's transformer optimizer fuses into its CPU kernels (Attention, EmbedLayerNormalization,
SkipLayerNormalization, BiasGelu: BENCHMARKS.md §2, round six); the fused graph is kept only where it gives the
unfused graph's vectors, else the unfused one is (a model whose graph the optimizer does not know). onnx-int8 is the
same graph with its weights dynamically quantised per channel (onnxruntime.quantization). Each file is written under a
temporary name and renamed into place, so a process that finds the target finds it whole."""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

NAMES = ["input_ids", "attention_mask", "token_type_ids"]
# the fused graph's largest difference to the unfused one on the sample texts, above which it is not used
FUSED_TOLERANCE = 1e-4
SAMPLE = [
    "an example",
    "a second, longer example, with some punctuation; and numbers: 12.5%",
    "Open valve V2 before starting pump P1. " * 8,
]

log = logging.getLogger(__name__)


def export_onnx(path: str, target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        plain = Path(scratch) / "plain.onnx"
        config, inputs = export_plain(path, plain)
        fused = Path(scratch) / target.name
        if not fuse(plain, fused, config, inputs):
            os.replace(plain, fused)
        os.replace(fused, target)


def export_plain(path: str, target: Path) -> tuple[Any, dict]:
    """The model's unfused graph, and (for fuse) its configuration and sample inputs."""
    import torch
    from sentence_transformers import SentenceTransformer

    # its Transformer module; Any: torch types a module's attributes (tokenizer, auto_model) as Tensor | Module.
    # Eager attention: the SDPA graph (torch's default) exports as unfused matmuls with NaN guards that the
    # optimizer cannot fuse
    transformer: Any = SentenceTransformer(path, device="cpu", model_kwargs={"attn_implementation": "eager"})[0]

    class Encoder(torch.nn.Module):  # the word-piece vectors; pooling and normalising run on numpy
        def __init__(self, model: torch.nn.Module):
            super().__init__()
            self.model: torch.nn.Module = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    sample = transformer.tokenizer(SAMPLE, padding=True, return_tensors="pt")
    torch.onnx.export(
        Encoder(transformer.auto_model.eval()),
        tuple(sample[n] for n in NAMES),
        str(target),
        input_names=NAMES,
        output_names=["last_hidden_state"],
        opset_version=17,
        dynamo=False,
        dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*NAMES, "last_hidden_state"]},
    )
    return transformer.auto_model.config, {n: sample[n].numpy() for n in NAMES}


def fuse(plain: Path, target: Path, config: Any, inputs: dict) -> bool:
    """Write the transformer-fused graph of `plain` to target; False (nothing written) where the optimizer fails,
    fuses no attention, or changes the vectors."""
    import numpy as np
    import onnxruntime

    try:
        from onnxruntime.transformers import optimizer

        model = optimizer.optimize_model(
            str(plain),
            model_type="bert",
            num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
            hidden_size=int(getattr(config, "hidden_size", 0) or 0),
        )
        if not model.get_fused_operator_statistics().get("Attention"):
            log.warning("the transformer optimizer fused no attention in %s: keeping the unfused graph", plain)
            return False
        model.save_model_to_file(str(target))
    except Exception:  # the optimizer is a best effort: an unknown graph keeps its unfused export
        log.exception("fusing %s failed: keeping the unfused graph", plain)
        return False
    before, after = (
        onnxruntime.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
        for p in (plain, target)
    )
    mask = inputs["attention_mask"][..., None].astype(bool)  # padded positions' vectors are never read
    difference = float(np.abs(np.where(mask, before - after, 0)).max())
    if difference > FUSED_TOLERANCE:
        log.warning("the fused graph differs by %.2g from the unfused one: keeping the unfused graph", difference)
        target.unlink()
        return False
    return True


def quantize(plain: Path, target: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        out = Path(scratch) / target.name
        # per channel: each output column its own scale (vectors at cosine >= 0.99 to fp32's, against 0.90 per
        # tensor, at the same speed: BENCHMARKS.md §2, round six); the fused operators' outputs have no inferred
        # type: they are float tensors
        quantize_dynamic(
            str(plain),
            str(out),
            weight_type=QuantType.QInt8,
            per_channel=True,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        os.replace(out, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", help="the sentence-transformers model directory")
    parser.add_argument("target", type=Path, help="the .onnx file to write")
    parser.add_argument("--int8", type=Path, metavar="PLAIN", help="quantise this fp32 export into target instead")
    args = parser.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"  # the model's own files, never a download
    logging.basicConfig(level=logging.WARNING)
    if args.int8 is not None:
        quantize(args.int8, args.target)
    else:
        export_onnx(args.model, args.target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
