/* graph.cu — a decode step recorded and launched as one CUDA graph (a candidate: $KVB_CUDA_GRAPH=1 or --cuda-kernels
 * graph=1, off by default until a GPU run has checked and timed it).
 *
 * Why: the default model's decode step is about 330 launches of small kernels (30 layers of about 11), and on the
 * H200 (2026-11-26) it ran at 2.27 ms a token, bound by launches rather than by bytes. A graph launches them as one.
 *
 * How (llama.cpp's CUDA backend does the same: capture each step, update the executable graph in place):
 * - The engine calls be->step_begin at the start of a one-token decode chunk (engine/model.c). The stream starts
 *   recording (relaxed mode: the host may still allocate).
 * - Everything the step enqueues is recorded, not run, until the host must wait or must touch memory the recorded
 *   work may still use: a sync, a copy down, a free, a synchronous upload, a staging buffer's event. Each of those
 *   places calls cuda_graph_flush first: the recording ends, the executable graph is updated in place from it (or
 *   made anew when the step's shape changed: another grid, a copy more), and launched; the rest of the step, if any,
 *   runs as plain launches. For full attention the step's only such place is its logits copy, so the whole step is
 *   one graph.
 * - Host bytes an op uploads while recording (token ids, positions, the attention's per-head pointer block, the data
 *   ops' parameters) are copied into a pinned arena first (cuda_graph_stage): the recorded copy reads them when the
 *   graph runs, so they must stay as they were until then. The arena is reused once the graph that read it has run.
 * - Work is only ever deferred, never reordered: host code that reads device results waits (sync), which flushes.
 * - A step cut by a wait is several graphs: the k-th of each step updates the k-th executable. Where every step makes
 *   its graphs anew (a shape that keeps changing) for CUDA_GRAPH_GIVE_UP steps in a row, recording stops for the
 *   process (an instantiation costs more than the launches it saves); the summary says so.
 * - The compute stream is a blocking stream: a call on the legacy default stream while it records would break the
 *   recording, so the backend's synchronous cudaMemcpy calls (weight and vector uploads) flush first. */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/candidate.h"
#include "kernels/cuda/kvops.h"

#define CK(call) cuda_kvops_check(o, (call), #call, __FILE__, __LINE__)

static int g_graph; /* 0 = not chosen yet, 1 = off, 2 = on */

extern "C" void kvb_cuda_set_graph(int on) { g_graph = on ? 2 : 1; }

extern "C" int kvb_cuda_graph_on(void) { return kvb_switch_on(&g_graph, "KVB_CUDA_GRAPH", 1); }

enum { ARENA_FIRST = 64 << 10, ARENA_MAX = 16 << 20 };

int cuda_graph_begin(cuda_kvops *o) {
    cuda_graph *g = &o->graph;
    if (!kvb_cuda_graph_on() || g->off || o->be->error[0]) return 0;
    if (g->capturing && cuda_graph_flush(o)) return -1; /* a step that never reached its end: run what it recorded */
    if (g->steps) { /* steps whose graphs never update in place cost an instantiation each: give up after a run */
        g->fresh_run = g->step_fresh ? g->fresh_run + 1 : 0;
        if (g->fresh_run >= CUDA_GRAPH_GIVE_UP) {
            g->off = 1;
            return 0;
        }
    }
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (CK(cudaStreamIsCapturing(o->stream, &st))) return -1;
    if (st != cudaStreamCaptureStatusNone) return 0; /* someone else records this stream: plain launches */
    if (!g->ran && CK(cudaEventCreateWithFlags(&g->ran, cudaEventDisableTiming))) return -1;
    /* the arena: the previous graph reads it until it has run (normally long done: the step ended with a sync) */
    if (CK(cudaEventSynchronize(g->ran))) return -1;
    if (!g->arena_want) g->arena_want = ARENA_FIRST;
    if (g->arena_want > g->arena_cap) {
        if (g->arena && CK(cudaFreeHost(g->arena))) return -1;
        g->arena = NULL;
        g->arena_cap = 0;
        if (CK(cudaMallocHost((void **)&g->arena, g->arena_want))) return -1;
        g->arena_cap = g->arena_want;
    }
    g->arena_used = 0;
    if (CK(cudaStreamBeginCapture(o->stream, cudaStreamCaptureModeRelaxed))) return -1;
    g->capturing = 1;
    g->seg = 0;
    g->step_fresh = 0;
    g->steps++;
    return 0;
}

int cuda_graph_flush(cuda_kvops *o) {
    cuda_graph *g = &o->graph;
    if (!g->capturing) return 0;
    g->capturing = 0;
    cudaGraph_t graph = NULL;
    const cudaError_t e = cudaStreamEndCapture(o->stream, &graph);
    if (e != cudaSuccess || !graph) {
        /* a call the recording cannot hold invalidated it: what it held is lost, so the backend fails (one line) */
        char why[160];
        snprintf(why, sizeof why, "cudaStreamEndCapture (KVB_CUDA_GRAPH=1: a call inside the decode step broke its "
                                  "recording; run without the graph)");
        if (graph) cudaGraphDestroy(graph);
        return cuda_kvops_check(o, e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated, why, __FILE__, __LINE__);
    }
    size_t nodes = 0;
    int rc = CK(cudaGraphGetNodes(graph, NULL, &nodes));
    if (!rc && nodes) {
        /* the step's k-th graph updates the k-th executable (a step cut by a wait keeps its segments' shapes apart) */
        cudaGraphExec_t *exec = &g->exec[g->seg < CUDA_GRAPH_SEGS ? g->seg : CUDA_GRAPH_SEGS - 1];
        g->seg++;
        if (*exec) {
            cudaGraphExecUpdateResultInfo info;
            memset(&info, 0, sizeof info);
            if (cudaGraphExecUpdate(*exec, graph, &info) == cudaSuccess) {
                g->updated++;
            } else { /* another shape (grids, a copy more): made anew */
                cudaGetLastError();
                g->last_update_result = (int)info.result;
                cudaGraphExecDestroy(*exec);
                *exec = NULL;
            }
        }
        if (!*exec) {
            rc = CK(cudaGraphInstantiate(exec, graph, 0));
            if (!rc) g->instantiated++, g->step_fresh = 1;
        }
        rc = rc || CK(cudaGraphLaunch(*exec, o->stream)) || CK(cudaEventRecord(g->ran, o->stream));
        if (!rc) g->graphs++, g->nodes += (long long)nodes;
    }
    cudaGraphDestroy(graph);
    return rc;
}

const void *cuda_graph_stage(cuda_kvops *o, const void *host, size_t bytes) {
    cuda_graph *g = &o->graph;
    if (!g->capturing) return NULL;
    const size_t at = (g->arena_used + 15) & ~(size_t)15;
    if (at + bytes > g->arena_cap) { /* no room this step: it ends here; the next step's arena is bigger */
        size_t want = 2 * (at + bytes);
        if (want > g->arena_want) g->arena_want = want < ARENA_MAX ? want : ARENA_MAX;
        cuda_graph_flush(o); /* a failure is in be->error: the caller's next call reports it */
        return NULL;
    }
    memcpy(g->arena + at, host, bytes);
    g->arena_used = at + bytes;
    return g->arena + at;
}

void cuda_graph_release(cuda_kvops *o) {
    cuda_graph *g = &o->graph;
    if (g->capturing) {
        cudaGraph_t graph = NULL;
        cudaStreamEndCapture(o->stream, &graph); /* dropped: the backend is going */
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        g->capturing = 0;
    }
    if (g->ran) cudaEventSynchronize(g->ran);
    for (int i = 0; i < CUDA_GRAPH_SEGS; i++)
        if (g->exec[i]) cudaGraphExecDestroy(g->exec[i]);
    if (g->ran) cudaEventDestroy(g->ran);
    cudaFreeHost(g->arena);
    memset(g, 0, sizeof *g);
}

void cuda_graph_summary(const cuda_kvops *o, char *buf, size_t cap) {
    const cuda_graph *g = &o->graph;
    if (!g->steps) {
        snprintf(buf, cap, "no decode step recorded");
        return;
    }
    char off[128] = "";
    if (g->off)
        snprintf(off, sizeof off, "; given up after %d steps in a row made anew (last update result %d)",
                 CUDA_GRAPH_GIVE_UP, g->last_update_result);
    snprintf(buf, cap,
             "%lld decode steps recorded, %lld graphs launched (%.2f a step: more than 1 = a step cut short by a wait "
             "or a free), %.0f nodes a graph, %lld updated in place, %lld made anew%s",
             g->steps, g->graphs, (double)g->graphs / (double)g->steps,
             g->graphs ? (double)g->nodes / (double)g->graphs : 0.0, g->updated, g->instantiated, off);
}
