"""The consumer-group client: membership, the Java client's allocation strategies, a
round's requests (heartbeats, member list, locks), where joining queues start, the
running info, and CONSUMER_SEND_MSG_BACK."""
