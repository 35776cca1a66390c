#include "engine/gguf_print.h"

#include <inttypes.h>

enum { MAX_STR_SHOWN = 120 };

/* Length of the valid UTF-8 sequence at p[0..n) that is not a C1 control (U+0080-U+009F), or 0. */
static int utf8_ok(const unsigned char *p, uint64_t n) {
    int len = p[0] >= 0xF0 && p[0] <= 0xF4 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 && p[0] < 0xE0 ? 2 : 0;
    if (len == 0 || (uint64_t)len > n) return 0;
    uint32_t cp = p[0] & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF) ||
        cp < 0xA0)
        return 0;
    return len;
}

/* Text from the file as the terminal may show it: control bytes, DEL, C1 controls and bytes that are not UTF-8
 * as \xNN (a key like "\x1b[2J" would otherwise clear the screen), newline as \n, quote and backslash escaped.
 * Returns the bytes written; out NULL only counts them. */
static uint64_t put_escaped(FILE *out, const char *ptr, uint64_t n) {
    const unsigned char *p = (const unsigned char *)ptr;
    uint64_t w = 0;
    for (uint64_t i = 0; i < n;) {
        unsigned char c = p[i];
        int l = c >= 0x80 ? utf8_ok(p + i, n - i) : 1;
        if (c == '\n' || c == '"' || c == '\\') {
            if (out) fprintf(out, "\\%c", c == '\n' ? 'n' : c);
            w += 2;
        } else if (c < 0x20 || c == 0x7f || l == 0) {
            if (out) fprintf(out, "\\x%02x", c);
            w += 4;
        } else {
            if (out) fwrite(p + i, 1, (size_t)l, out);
            w += (uint64_t)l;
        }
        i += l ? (uint64_t)l : 1;
    }
    return w;
}

static void print_str(FILE *out, gguf_str s) {
    fputc('"', out);
    uint64_t n = s.len < MAX_STR_SHOWN ? s.len : MAX_STR_SHOWN;
    put_escaped(out, s.ptr, n);
    fputc('"', out);
    if (s.len > n) fprintf(out, "... (%" PRIu64 " bytes)", s.len);
}

/* A key or tensor name, escaped, padded with spaces to width bytes. */
static void print_name(FILE *out, gguf_str s, int width) {
    for (uint64_t w = put_escaped(out, s.ptr, s.len); w < (uint64_t)width; w++) fputc(' ', out);
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
        fputs("  ", out);
        print_name(out, kv->key, 0);
        fprintf(out, " (%s) = ", gguf_vtype_name(kv->val.type));
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
        fputs("  ", out);
        print_name(out, t->name, 36);
        fprintf(out, " %-5s %-22s %12" PRIu64 " %12" PRIu64 "\n", ggml_type_name(t->type), shape, t->offset,
                t->n_bytes);
        if ((unsigned)t->type < 64) by_type[t->type] += t->n_bytes;
        total += t->n_bytes;
    }
    fprintf(out, "\nbytes by type:");
    for (int ty = 0; ty < 64; ty++)
        if (by_type[ty]) fprintf(out, " %s %.2f MiB;", ggml_type_name((ggml_type)ty), by_type[ty] / 1048576.0);
    fprintf(out, " total %.2f MiB\n", total / 1048576.0);
}
