/*
 * The exactly-once C path's side of the embedded broker's store (rmq_tx_store.c), used by
 * serve_tx()'s parts (rmq_serve_tx.h): the run's context, the store clock, topic and queue
 * lookups, storing a record at once or in the run's batch, handing the batch to the store,
 * and finding a half message. Everything goes through the store's fast-path interface
 * (embedded/store.py).
 */
#ifndef RMQ_TX_STORE_H
#define RMQ_TX_STORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define HALF_TOPIC "RMQ_SYS_TRANS_HALF_TOPIC"
#define OP_TOPIC "RMQ_SYS_TRANS_OP_HALF_TOPIC"

/* What the caller hands over (embedded/fast_paths.py transaction_answers' serve_tx call). */
typedef struct {
    PyObject *store, *topics, *queues, *commit_log, *long_poll, *crc32;
    const uint8_t *store_host, *born_host;
    Py_ssize_t store_host_len, born_host_len;
    const char *cluster, *trace_on, *region;
    long long max_message_size;
    int version;
    struct batch *b;  /* the records of this run not yet in the store; NULL: store each now */
    int own_clock;    /* store.now is BrokerStore.now itself (store_now reads it in C) */
} ctx_t;

/* The run's records not yet handed to the store (batch mode): the commit log is appended once
 * and each queue extended once, at the end of the run (flush_batch), instead of per record.
 * Offsets come from the sizes: a queue's next offset is its max offset when the run first
 * touched it plus the records pending for it, the next physical offset the commit log's size
 * at the run's first record plus the bytes pending. Nothing else writes the store meanwhile:
 * the run holds the GIL except inside the Python calls it makes itself (store.now, crc32,
 * store.queue), and they do not append. */
#define MAX_PQ 32
typedef struct {
    char topic[128];
    int64_t qid;
    PyObject *queue, *topic_o, *qid_o, *records, *codes, *times;
    long long base;  /* the queue's max offset when the run first stored in it */
    Py_ssize_t n;
} pq_t;

typedef struct batch {
    int nq;
    pq_t q[MAX_PQ];
    PyObject *all;  /* every pending record, in store order */
    long long log_base;
    Py_ssize_t bytes;
    int have_base;
} batch_t;

/* Store one record in (topic, queue_id) as transactions.py _append / BrokerStore.append do:
 * ``build`` writes the record for (queue offset, physical offset, now) into a new bytes
 * object; *at gets its queue and physical offsets. Returns 0, or -1 with an error set (the
 * broker's state may then be partial, as it would be after a failing Python handler). */
typedef PyObject *(*build_fn)(const void *arg, int64_t queue_offset, int64_t phys, int64_t now);

/* Intern the attribute names used here: 0, or -1 with an error. */
int tx_store_names(void);
/* Whether store.now is embedded/store.py's BrokerStore.now bound to the store: 1, 0, or -1. */
int tx_own_clock(PyObject *store);
/* The topic's config in store.topics, borrowed; NULL (no error) when there is none. */
PyObject *tx_topic_config(const ctx_t *c, const uint8_t *topic, Py_ssize_t n);
/* store.queue(topic, queue_id), a new reference. */
PyObject *tx_get_queue(const ctx_t *c, PyObject *topic, PyObject *qid);
/* 1: the topic exists, is writable, SINGLE_TAG and has queue qid; 0: not so; -1: error. */
int tx_topic_takes(const ctx_t *c, const uint8_t *topic, Py_ssize_t n, int64_t qid);
int tx_store_record(const ctx_t *c, const char *topic, int64_t queue_id, int32_t code,
                    build_fn build, const void *arg, long long at[2]);
/* Hand the run's pending records to the store: 0, -1 (nothing stored) or -2 (stored in the
 * commit log only), with an error set; the pending records are forgotten either way. */
int tx_flush_batch(const ctx_t *c);
/* Forget the pending records (stored or dropped). */
void tx_batch_clear(batch_t *b);
/* The half record at commit-log offset phys (a new reference, its queue offset in
 * *queue_offset), NULL without an error when there is none. */
PyObject *tx_find_half(const ctx_t *c, int64_t phys, int64_t hint, int64_t *queue_offset);

#endif /* RMQ_TX_STORE_H */
