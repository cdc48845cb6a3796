"""What serving stacks write to Kafka, read as decisions: Open Inference Protocol tensors
(protobuf and JSON), Seldon Core 2 topics and KServe's inference-logger CloudEvents.

``grpc_predict_v2_pb2.py`` is generated from KServe's Apache-2.0 ``grpc_predict_v2.proto``
(beside it, unmodified, with its licence header) by ``grpc_tools.protoc`` 1.85.1 (libprotoc
35.1, gencode for protobuf 7.35.1): messages only, no gRPC service code.
"""
