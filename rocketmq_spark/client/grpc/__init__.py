"""The RocketMQ 5.x proxy transport (gRPC): a producer for clusters reached only through the
proxy's ``MessagingService`` endpoint (port 8081 by default).

:class:`GrpcProducer` is the typed client. The wire types are our own subset of
apache/rocketmq-apis (``proto/``), generated into ``definition_pb2``, ``service_pb2`` and
``service_pb2_grpc`` by ``ci/gen_proto.sh``. Apache's proxy does not serve gRPC PullMessage, so
reading always uses remoting. Like the rest of ``client/``, nothing here knows Spark.
"""
from .producer import GrpcProducer, GrpcSendFuture

__all__ = ["GrpcProducer", "GrpcSendFuture"]
