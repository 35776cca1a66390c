/* kvops.h — the CUDA backend's data ops (kernels/backend.h, "data ops"); kernels in kvops.cu. C++ (nvcc) only.
 *
 * The ops keep their state in a cuda_kvops that the backend's private state (cuda_impl, backend_cuda.cu) holds
 * as its first member, so an op finds it at be->impl. */
#ifndef KVB_CUDA_KVOPS_H
#define KVB_CUDA_KVOPS_H

#include <cuda_runtime.h>

extern "C" {
#include "kernels/backend.h"
}

enum { KVOPS_PARAM_RING = 8 };

/* A decode step recorded as one CUDA graph (graph.cu: a candidate, $KVB_CUDA_GRAPH=1) */
enum { CUDA_GRAPH_SEGS = 4, CUDA_GRAPH_GIVE_UP = 16 };
typedef struct {
    int capturing;          /* the stream is recording the step */
    int seg;                /* the step's graphs so far (a wait inside the step ends one; the rest is recorded anew) */
    int off;                /* 1: given up (CUDA_GRAPH_GIVE_UP steps in a row made their graphs anew) */
    int fresh_run;          /* steps in a row whose graphs were all made anew */
    int step_fresh;         /* this step made one anew */
    /* the graph of each of a step's first CUDA_GRAPH_SEGS segments (the later ones share the last), updated in place
     * from the next step's where its shape allows */
    cudaGraphExec_t exec[CUDA_GRAPH_SEGS];
    cudaEvent_t ran;        /* after the last graph launch: its arena may be written again once this has fired */
    uint8_t *arena;         /* pinned host bytes the recorded copies read (cuda_graph_stage) */
    size_t arena_cap, arena_used, arena_want;
    long long steps, graphs, nodes, updated, instantiated; /* for cuda_graph_summary */
    int last_update_result;  /* cudaGraphExecUpdateResult of the last update that failed (0: none) */
} cuda_graph;

typedef struct {
    kvb_backend *be;     /* whose error[] keeps the first failure ("cuda: FILE:LINE: CALL: reason") */
    cudaStream_t stream; /* the backend's stream: every op enqueues on it */
    /* pinned host buffers, each reused once its event says the copies reading it are done */
    uint8_t *stage; size_t stage_bytes; cudaEvent_t stage_done; /* kv_gather's packed rows */
    /* small host parameters (weights, flags, kv_load's head table and lists): a ring of KVOPS_PARAM_RING pinned
     * buffers, each with its device copy and the event after its copy up, so that a call waits only for the copy
     * made KVOPS_PARAM_RING calls earlier (long done), not for everything queued before the previous call */
    uint8_t *param[KVOPS_PARAM_RING]; size_t param_bytes[KVOPS_PARAM_RING]; cudaEvent_t param_done[KVOPS_PARAM_RING];
    void *param_dev[KVOPS_PARAM_RING]; size_t param_dev_bytes[KVOPS_PARAM_RING];
    int param_next;
    void *scratch; size_t scratch_bytes;                        /* device scratch: top-k flags, overlapping copies */
    void *gelu_table;                                           /* geglu's f16 GELU table (arch_ops.cu), on first use */
    cuda_graph graph;                                           /* the decode step's recording (graph.cu) */
} cuda_kvops;

/* Set up ops for be on stream and install be's data ops (be->impl must begin with *ops). 0, or -1 with the
 * reason in be->error. */
int cuda_install_data_ops(kvb_backend *be, cuda_kvops *ops, cudaStream_t stream);
/* Free what the ops allocated (waits for the stream first). */
void cuda_kvops_release(cuda_kvops *ops);
/* For op files beside kvops.cu: record a failed CUDA call in be->error (0 when e is cudaSuccess, else -1), and
 * an int-returning op's answer once the backend has failed (-1, be->error in err). */
int cuda_kvops_check(cuda_kvops *o, cudaError_t e, const char *call, const char *file, int line);
int cuda_kvops_failed(cuda_kvops *o, char *err, size_t err_len);
/* The ops' device scratch, at least need bytes, for kernels enqueued next on the stream (the next op that asks may
 * reuse it, stream-ordered after them); NULL with the failure in be->error. */
void *cuda_kvops_scratch(cuda_kvops *o, size_t need);
/* The decode step's graph (graph.cu). begin: the stream starts recording (where $KVB_CUDA_GRAPH=1 and nothing else
 * records it). flush: a recording in progress ends and runs as one graph; every place that waits for the stream,
 * frees or replaces memory, uploads synchronously or reuses a host buffer an earlier copy reads calls it first
 * (0, or -1 with the reason in be->error). stage: while recording, a pinned copy of host's bytes that stays intact
 * until the recorded graph has run, for the copy up to read; NULL when not recording (or no room: the recording was
 * flushed), and the caller goes its usual way. */
int cuda_graph_begin(cuda_kvops *o);
/* The host waits for the stream: a decode step's recording runs first (0, or -1 with the reason in be->error). */
int cuda_kvops_wait(cuda_kvops *o);
int cuda_graph_flush(cuda_kvops *o);
const void *cuda_graph_stage(cuda_kvops *o, const void *host, size_t bytes);
void cuda_graph_release(cuda_kvops *o);
void cuda_graph_summary(const cuda_kvops *o, char *buf, size_t cap);
extern "C" int kvb_cuda_graph_on(void);
/* KIVI's quantized-KV ops (kvquant.cu): install be's quant_groups and attention_quant. */
void cuda_install_kvquant_ops(kvb_backend *be);
/* attention_quant's kernel: 1 (default) or 2 (the candidate: tokens split across blocks), $KVB_QUANT_KERNEL */
extern "C" int kvb_cuda_quant_kernel(void);
/* The newer architectures' elementwise ops (arch_ops.cu): install be's rope_ext, geglu and scale. */
void cuda_install_arch_ops(kvb_backend *be);
/* The elementwise ops on per-slot vectors (elemops.cu): install be's mul_f32 .. block_ranks. */
void cuda_install_elem_ops(kvb_backend *be);

#endif
