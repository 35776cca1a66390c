#include "engine/gguf_print.h"

#include <inttypes.h>

enum { MAX_STR_SHOWN = 120 };

static void print_str(FILE *out, gguf_str s) {
    fputc('"', out);
    uint64_t n = s.len < MAX_STR_SHOWN ? s.len : MAX_STR_SHOWN;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '\n') fputs("\\n", out);
        else if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c < 0x20) fprintf(out, "\\x%02x", c);
        else fputc(c, out);
    }
    fputc('"', out);
    if (s.len > n) fprintf(out, "... (%" PRIu64 " bytes)", s.len);
}

static void print_value(FILE *out, const gguf_value *v, int max_items) {
    switch (v->type) {
    case GGUF_VT_UINT8: case GGUF_VT_UINT16: case GGUF_VT_UINT32: case GGUF_VT_UINT64:
        fprintf(out, "%" PRIu64, v->v.u);
        break;
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
        fprintf(out, "%" PRId64, v->v.i);
        break;
    case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64:
        fprintf(out, "%g", v->v.f);
        break;
    case GGUF_VT_BOOL:
        fputs(v->v.u ? "true" : "false", out);
        break;
    case GGUF_VT_STRING:
        print_str(out, v->v.s);
        break;
    case GGUF_VT_ARRAY: {
        uint64_t n = v->v.arr.count, shown = n < (uint64_t)max_items ? n : (uint64_t)max_items;
        fprintf(out, "[%s x %" PRIu64 "] [", gguf_vtype_name(v->v.arr.elem_type), n);
        for (uint64_t i = 0; i < shown; i++) {
            if (i) fputs(", ", out);
            gguf_vtype et = v->v.arr.elem_type;
            if (et == GGUF_VT_STRING) print_str(out, v->v.arr.strs[i]);
            else if (et == GGUF_VT_ARRAY) print_value(out, &v->v.arr.items[i], max_items);
            else if (et == GGUF_VT_FLOAT32 || et == GGUF_VT_FLOAT64) fprintf(out, "%g", gguf_arr_f64(v, i));
            else fprintf(out, "%" PRId64, gguf_arr_i64(v, i));
        }
        fputs(shown < n ? ", ...]" : "]", out);
        break;
    }
    default:
        fputs("?", out);
    }
}

void gguf_print(const gguf_file *f, FILE *out, int max_items) {
    fprintf(out, "GGUF v%u, alignment %u, %" PRIu64 " metadata keys, %" PRIu64 " tensors, data at byte %" PRIu64 "\n\n",
            f->version, f->alignment, f->n_kv, f->n_tensors, f->data_offset);
    fprintf(out, "metadata:\n");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        fprintf(out, "  %.*s (%s) = ", (int)kv->key.len, kv->key.ptr, gguf_vtype_name(kv->val.type));
        print_value(out, &kv->val, max_items);
        fputc('\n', out);
    }
    fprintf(out, "\ntensors:\n  %-36s %-5s %-22s %12s %12s\n", "name", "type", "shape", "offset", "bytes");
    uint64_t by_type[64] = {0}, total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        char shape[64];
        int n = snprintf(shape, sizeof shape, "[%" PRIu64, t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims && n > 0 && (size_t)n < sizeof shape; d++)
            n += snprintf(shape + n, sizeof shape - (size_t)n, ", %" PRIu64, t->ne[d]);
        if (n > 0 && (size_t)n < sizeof shape) snprintf(shape + n, sizeof shape - (size_t)n, "]");
        fprintf(out, "  %-36.*s %-5s %-22s %12" PRIu64 " %12" PRIu64 "\n", (int)t->name.len, t->name.ptr,
                ggml_type_name(t->type), shape, t->offset, t->n_bytes);
        if ((unsigned)t->type < 64) by_type[t->type] += t->n_bytes;
        total += t->n_bytes;
    }
    fprintf(out, "\nbytes by type:");
    for (int ty = 0; ty < 64; ty++)
        if (by_type[ty]) fprintf(out, " %s %.2f MiB;", ggml_type_name((ggml_type)ty), by_type[ty] / 1048576.0);
    fprintf(out, " total %.2f MiB\n", total / 1048576.0);
}
