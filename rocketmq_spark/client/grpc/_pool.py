"""A descriptor pool of our own for the generated apache.rocketmq.v2 modules.

Every protobuf module normally registers its types in one process-wide pool, so two copies of
the same package (ours and, say, the official ``rocketmq-python-client``'s, which a user may
import in the same driver) collide with "duplicate symbol". Ours live here instead, beside the
two well-known types they use.
"""
from google.protobuf import descriptor_pool, duration_pb2, timestamp_pb2

POOL = descriptor_pool.DescriptorPool()
for _module in (duration_pb2, timestamp_pb2):
    POOL.AddSerializedFile(_module.DESCRIPTOR.serialized_pb)
