/*
 * serve_tx()'s message properties (rmq_serve_tx.h): read as the Python broker's
 * decode_properties reads them, and written back in a Java HashMap's order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rmq_bytes.h"
#include "rmq_reqhdr.h"
#include "rmq_serve_tx.h"

/* ---------------------------------------------------------------- message properties */

int tx_props_find(const props_t *m, const char *name) {
    Py_ssize_t l = (Py_ssize_t)strlen(name);
    for (int i = 0; i < m->n; i++)
        if (m->name[i].n == l && memcmp(m->name[i].p, name, l) == 0) return i;
    return -1;
}

int tx_props_put(props_t *m, const uint8_t *k, Py_ssize_t kl, const uint8_t *v,
                 Py_ssize_t vl) {
    for (int i = 0; i < m->n; i++) {
        if (m->name[i].n == kl && memcmp(m->name[i].p, k, kl) == 0) {
            m->value[i].p = v; m->value[i].n = vl;
            return 0;
        }
    }
    if (m->n == MAX_PROPS) return -1;
    m->name[m->n].p = k; m->name[m->n].n = kl;
    m->value[m->n].p = v; m->value[m->n].n = vl;
    m->n++;
    return 0;
}

/* Java's split on \x02, the first \x01 splitting name and value. A value holding another
 * \x01 cannot be written back (encode_properties refuses it): left to Python. */
int tx_props_parse(const uint8_t *p, Py_ssize_t n, props_t *m) {
    m->n = 0;
    Py_ssize_t i = 0;
    while (i <= n) {
        Py_ssize_t j = i;
        while (j < n && p[j] != 0x02) j++;
        if (j - i >= 3) {
            Py_ssize_t s = i;
            while (s < j && p[s] != 0x01) s++;
            if (s < j && s > i && j > s + 1) {
                for (Py_ssize_t c = s + 1; c < j; c++)
                    if (p[c] == 0x01) return -1;
                if (tx_props_put(m, p + i, s - i, p + s + 1, j - s - 1) < 0) return -1;
            }
        }
        i = j + 1;
    }
    return 0;
}

/* String.hashCode() of ASCII text. */
int32_t tx_java_hash(const uint8_t *p, Py_ssize_t n) {
    uint32_t h = 0;
    for (Py_ssize_t i = 0; i < n; i++) h = 31 * h + p[i];
    return (int32_t)h;
}

/* The properties text of a HashMap holding m (java_hashmap_order, then name\x01value joined
 * by \x02, no trailing separator), written to out (MAX_PROPS_BYTES + 1 bytes); its length, or
 * -1 when it does not fit a record. */
Py_ssize_t tx_props_write(const props_t *m, uint8_t *out) {
    int capacity = 16;
    while (m->n * 4 > capacity * 3)  /* len(keys) > capacity * 0.75 */
        capacity *= 2;
    int order[MAX_PROPS], bucket[MAX_PROPS];
    for (int i = 0; i < m->n; i++) {
        uint32_t h = (uint32_t)tx_java_hash(m->name[i].p, m->name[i].n);
        bucket[i] = (int)((h ^ (h >> 16)) & (uint32_t)(capacity - 1));
        /* stable insertion sort by bucket: insertion order within a bucket */
        int j = i;
        while (j > 0 && bucket[order[j - 1]] > bucket[i]) { order[j] = order[j - 1]; j--; }
        order[j] = i;
    }
    Py_ssize_t pos = 0;
    for (int x = 0; x < m->n; x++) {
        int i = order[x];
        Py_ssize_t need = m->name[i].n + 1 + m->value[i].n + (x ? 1 : 0);
        if (pos + need > MAX_PROPS_BYTES) return -1;
        if (x) out[pos++] = 0x02;
        memcpy(out + pos, m->name[i].p, m->name[i].n);
        pos += m->name[i].n;
        out[pos++] = 0x01;
        memcpy(out + pos, m->value[i].p, m->value[i].n);
        pos += m->value[i].n;
    }
    return pos;
}

/* The TAGS tag code of a property map (0 without tags). */
int32_t tx_props_tag_code(const props_t *m) {
    int t = tx_props_find(m, "TAGS");
    return t < 0 ? 0 : tx_java_hash(m->value[t].p, m->value[t].n);
}
