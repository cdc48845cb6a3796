"""Several ONNX models as one, for a query over several networks: each model's tensors
prefixed with its network's name, inputs and outputs joined in the networks' order, and an
input the query equates with an earlier network's input read from that one instead."""

from __future__ import annotations

import onnx
from onnx import compose, helper

from vigil.rules.graph.importer import data_inputs
from vigil.rules.graph.values import UnsupportedModel


def merge(
    models: list[tuple[str, onnx.ModelProto]],
    aliases: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (),
) -> onnx.ModelProto:
    """One model computing every ``(name, model)``; ``aliases`` pairs (network, input
    position) of an earlier input with a later one that is to read it."""
    prefixed = [compose.add_prefix(model, f"{name}/") for name, model in models]
    inputs = [data_inputs(model.graph) for model in prefixed]
    renamed = {
        inputs[later][j].name: inputs[earlier][i].name for (earlier, i), (later, j) in aliases
    }
    nodes = []
    for model in prefixed:
        for node in model.graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [renamed.get(name, name) for name in node.input]
            nodes.append(copy)
    domains: dict[str, int] = {}
    for model in prefixed:
        for opset in model.opset_import:
            domains[opset.domain] = max(domains.get(opset.domain, 0), opset.version)
    if any(d not in ("", "ai.onnx") for d in domains):
        raise UnsupportedModel(f"operator domains {sorted(domains)}: only the ONNX one is read")
    graph = helper.make_graph(
        nodes,
        "+".join(name for name, _ in models),
        [i for group in inputs for i in group if i.name not in renamed],
        [o for model in prefixed for o in model.graph.output],
        [t for model in prefixed for t in model.graph.initializer],
    )
    merged = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in domains.items()]
    )
    merged.ir_version = max(model.ir_version for model in prefixed)
    return merged
