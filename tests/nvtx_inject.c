/* nvtx_inject.c — a minimal NVTX v3 tool: records every NVTX event of a process to a text file, so a test can read
 * kvbench's timeline without Nsight.
 *
 * Loading: NVTX v3 (header-only, compiled into the application) reads NVTX_INJECTION64_PATH at the first NVTX
 * call, dlopens that library and calls its InitializeInjectionNvtx2(getExportTable). The tool asks the export
 * table NVTX_ETID_CALLBACKS for each callback module's function table (GetModuleFunctionTable: an array of
 * pointers to the application's function-pointer slots, indexed by NVTX_CBID_*) and writes its handlers into
 * the slots it implements; NVTX sets the rest to no-ops. Returning 0 from the init leaves every call a no-op.
 *
 *   NVTX_INJECTION64_PATH=build/libkvb_nvtx_inject.so KVB_NVTX_LOG=/tmp/nvtx.tsv kvbench generate ...
 *
 * The log: one line per event, seven tab-separated fields (a field that does not apply is "-"):
 *     event  tid  domain  category  message  payload  id
 * event: domain_create, domain_destroy, category (message = the name, category = its id), push, pop, mark,
 * start, end. domain: the domain's name ("-" for the default domain of the non-domain API). category: the
 * category's registered name, or its number when it has none. message: the ASCII or registered string (tabs
 * and newlines become spaces); a pop's message is the message of the range it closes (a per-thread stack).
 * payload: the value in decimal (%.17g for floating types). id: a start/end range's id. Attributes whose
 * version or size are not NVTX v3's get the message "!bad-attributes"; a pop with no open range "!unbalanced".
 * One stack of open ranges per thread, shared by all domains (kvbench uses one).
 *
 * Recorded: the core and core2 (domain) ASCII APIs — marks, push/pop and start/end ranges, categories,
 * registered strings, domains. Not recorded: wide-character (W) variants, resources, CUDA/OpenCL naming, sync. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <nvtx3/nvToolsExt.h>

enum { MAX_DEPTH = 64, MSG_MAX = 160 };

typedef struct category {
    uint32_t id;
    char *name;
    struct category *next;
} category;

/* a domain handle points at one of these; one per name, never freed (handles outlive nvtxDomainDestroy) */
typedef struct domain {
    char *name;
    category *categories;
    struct domain *next;
} domain;

/* kept on a list for the process's life: the application may use a handle until exit, and a leak checker
 * should see them reachable */
typedef struct registered_string {
    char *text;
    struct registered_string *next;
} registered_string;

static FILE *log_file;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards the domain list and the log's line order */
static domain default_domain = {"-", NULL, NULL};
static domain *domains;
static registered_string *strings;
static uint64_t next_range_id = 1;
static _Thread_local char stack[MAX_DEPTH][MSG_MAX]; /* messages of this thread's open push ranges */
static _Thread_local int depth;

static domain *dom(nvtxDomainHandle_t h) { return h ? (domain *)h : &default_domain; }

static void copy_clean(char *dst, const char *src) {
    size_t i = 0;
    for (; src && src[i] && i < MSG_MAX - 1; i++) dst[i] = src[i] == '\t' || src[i] == '\n' ? ' ' : src[i];
    dst[i] = 0;
}

/* the category's name in d, or its number */
static void category_text(const domain *d, uint32_t id, char *out, size_t cap) {
    for (const category *c = d->categories; c; c = c->next)
        if (c->id == id) {
            snprintf(out, cap, "%s", c->name);
            return;
        }
    snprintf(out, cap, "%" PRIu32, id);
}

/* message, category and payload of an event's attributes */
static void attr_text(const domain *d, const nvtxEventAttributes_t *a, char *msg, char *cat, char *payload) {
    strcpy(cat, "-");
    strcpy(payload, "-");
    msg[0] = 0;
    if (!a || a->version != NVTX_VERSION || a->size != NVTX_EVENT_ATTRIB_STRUCT_SIZE) {
        strcpy(msg, "!bad-attributes");
        return;
    }
    if (a->messageType == NVTX_MESSAGE_TYPE_ASCII) copy_clean(msg, a->message.ascii);
    else if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED && a->message.registered)
        copy_clean(msg, ((const registered_string *)a->message.registered)->text);
    else if (a->messageType == NVTX_MESSAGE_TYPE_UNICODE) strcpy(msg, "!unicode");
    if (a->category) category_text(d, a->category, cat, 64);
    switch (a->payloadType) {
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64: snprintf(payload, 64, "%" PRIu64, a->payload.ullValue); break;
    case NVTX_PAYLOAD_TYPE_INT64: snprintf(payload, 64, "%" PRId64, a->payload.llValue); break;
    case NVTX_PAYLOAD_TYPE_DOUBLE: snprintf(payload, 64, "%.17g", a->payload.dValue); break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32: snprintf(payload, 64, "%" PRIu32, a->payload.uiValue); break;
    case NVTX_PAYLOAD_TYPE_INT32: snprintf(payload, 64, "%" PRId32, a->payload.iValue); break;
    case NVTX_PAYLOAD_TYPE_FLOAT: snprintf(payload, 64, "%.9g", (double)a->payload.fValue); break;
    default: break;
    }
}

static void put(const char *event, const domain *d, const char *cat, const char *msg, const char *payload,
                uint64_t id) {
    char id_text[32] = "-";
    if (id) snprintf(id_text, sizeof id_text, "%" PRIu64, id);
    fprintf(log_file, "%s\t%ld\t%s\t%s\t%s\t%s\t%s\n", event, (long)syscall(SYS_gettid), d->name, cat,
            msg && msg[0] ? msg : "-", payload, id_text);
}

static void event_attr(const char *event, nvtxDomainHandle_t h, const nvtxEventAttributes_t *a, uint64_t id) {
    char msg[MSG_MAX], cat[64], payload[64];
    pthread_mutex_lock(&lock);
    attr_text(dom(h), a, msg, cat, payload);
    put(event, dom(h), cat, msg, payload, id);
    if (!strcmp(event, "push")) {
        if (depth < MAX_DEPTH) strcpy(stack[depth], msg);
        depth++;
    }
    pthread_mutex_unlock(&lock);
}

static void event_ascii(const char *event, nvtxDomainHandle_t h, const char *text) {
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = text;
    event_attr(event, h, &a, 0);
}

static int pop(nvtxDomainHandle_t h) {
    pthread_mutex_lock(&lock);
    int d = depth > 0 ? --depth : -1;
    put("pop", dom(h), "-", d >= 0 && d < MAX_DEPTH ? stack[d] : "!unbalanced", "-", 0);
    pthread_mutex_unlock(&lock);
    return d;
}

static uint64_t start(nvtxDomainHandle_t h, const nvtxEventAttributes_t *a) {
    pthread_mutex_lock(&lock);
    uint64_t id = next_range_id++;
    pthread_mutex_unlock(&lock);
    event_attr("start", h, a, id);
    return id;
}

static void end(nvtxDomainHandle_t h, nvtxRangeId_t id) {
    pthread_mutex_lock(&lock);
    put("end", dom(h), "-", "-", "-", id);
    pthread_mutex_unlock(&lock);
}

static void name_category(nvtxDomainHandle_t h, uint32_t id, const char *name) {
    category *c = calloc(1, sizeof *c);
    char *copy = strdup(name ? name : "");
    pthread_mutex_lock(&lock);
    if (c && copy) {
        c->id = id;
        c->name = copy;
        c->next = dom(h)->categories;
        dom(h)->categories = c;
    } else {
        free(c);
        free(copy);
    }
    char id_text[32], msg[MSG_MAX];
    snprintf(id_text, sizeof id_text, "%" PRIu32, id);
    copy_clean(msg, name);
    put("category", dom(h), id_text, msg, "-", 0);
    pthread_mutex_unlock(&lock);
}

/* ---- core: the default domain ---- */
static void mark_ex(const nvtxEventAttributes_t *a) { event_attr("mark", NULL, a, 0); }
static void mark_a(const char *m) { event_ascii("mark", NULL, m); }
static nvtxRangeId_t range_start_ex(const nvtxEventAttributes_t *a) { return start(NULL, a); }
static nvtxRangeId_t range_start_a(const char *m) {
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = m;
    return start(NULL, &a);
}
static void range_end(nvtxRangeId_t id) { end(NULL, id); }
static int range_push_ex(const nvtxEventAttributes_t *a) {
    event_attr("push", NULL, a, 0);
    return depth - 1;
}
static int range_push_a(const char *m) {
    event_ascii("push", NULL, m);
    return depth - 1;
}
static int range_pop(void) { return pop(NULL); }
static void name_category_a(uint32_t id, const char *name) { name_category(NULL, id, name); }

/* ---- core2: domains ---- */
static void domain_mark_ex(nvtxDomainHandle_t h, const nvtxEventAttributes_t *a) { event_attr("mark", h, a, 0); }
static nvtxRangeId_t domain_range_start_ex(nvtxDomainHandle_t h, const nvtxEventAttributes_t *a) { return start(h, a); }
static void domain_range_end(nvtxDomainHandle_t h, nvtxRangeId_t id) { end(h, id); }
static int domain_range_push_ex(nvtxDomainHandle_t h, const nvtxEventAttributes_t *a) {
    event_attr("push", h, a, 0);
    return depth - 1;
}
static int domain_range_pop(nvtxDomainHandle_t h) { return pop(h); }
static void domain_name_category_a(nvtxDomainHandle_t h, uint32_t id, const char *name) { name_category(h, id, name); }

static nvtxStringHandle_t domain_register_string_a(nvtxDomainHandle_t h, const char *s) {
    (void)h;
    registered_string *r = calloc(1, sizeof *r);
    if (!r || !(r->text = strdup(s ? s : ""))) {
        free(r);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    r->next = strings;
    strings = r;
    pthread_mutex_unlock(&lock);
    return (nvtxStringHandle_t)r;
}

static nvtxDomainHandle_t domain_create_a(const char *name) {
    pthread_mutex_lock(&lock);
    domain *d = domains;
    while (d && strcmp(d->name, name ? name : "")) d = d->next;
    if (!d && (d = calloc(1, sizeof *d)) != NULL) {
        if ((d->name = strdup(name ? name : "")) != NULL) {
            d->next = domains;
            domains = d;
        } else {
            free(d);
            d = NULL;
        }
    }
    if (d) put("domain_create", d, "-", "-", "-", 0);
    pthread_mutex_unlock(&lock);
    return (nvtxDomainHandle_t)d;
}

static void domain_destroy(nvtxDomainHandle_t h) {
    if (!h) return;
    pthread_mutex_lock(&lock);
    put("domain_destroy", dom(h), "-", "-", "-", 0);
    pthread_mutex_unlock(&lock);
}

/* writes fn into slot id of the module's table when the application's table has that slot */
static void set_slot(NvtxFunctionTable table, unsigned size, unsigned id, NvtxFunctionPointer fn) {
    if (table && id < size && table[id]) *table[id] = fn;
}

#define SLOT(table, size, id, fn) set_slot(table, size, id, (NvtxFunctionPointer)(fn))

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table);

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
    const char *path = getenv("KVB_NVTX_LOG");
    if (!path || !*path) {
        fprintf(stderr, "nvtx_inject: KVB_NVTX_LOG is not set; recording nothing\n");
        return 0;
    }
    log_file = fopen(path, "w");
    if (!log_file) {
        fprintf(stderr, "nvtx_inject: cannot write %s; recording nothing\n", path);
        return 0;
    }
    setvbuf(log_file, NULL, _IOLBF, 0); /* whole lines even if the process dies */
    const NvtxExportTableCallbacks *cb = get_export_table(NVTX_ETID_CALLBACKS);
    const NvtxExportTableVersionInfo *ver = get_export_table(NVTX_ETID_VERSIONINFO);
    if (!cb || cb->struct_size < sizeof *cb || !cb->GetModuleFunctionTable) return 0;
    if (ver && ver->struct_size >= sizeof *ver && ver->SetInjectionNvtxVersion) ver->SetInjectionNvtxVersion(NVTX_VERSION);

    NvtxFunctionTable core = NULL, core2 = NULL;
    unsigned n_core = 0, n_core2 = 0;
    if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &n_core) ||
        !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &n_core2))
        return 0;
    SLOT(core, n_core, NVTX_CBID_CORE_MarkEx, mark_ex);
    SLOT(core, n_core, NVTX_CBID_CORE_MarkA, mark_a);
    SLOT(core, n_core, NVTX_CBID_CORE_RangeStartEx, range_start_ex);
    SLOT(core, n_core, NVTX_CBID_CORE_RangeStartA, range_start_a);
    SLOT(core, n_core, NVTX_CBID_CORE_RangeEnd, range_end);
    SLOT(core, n_core, NVTX_CBID_CORE_RangePushEx, range_push_ex);
    SLOT(core, n_core, NVTX_CBID_CORE_RangePushA, range_push_a);
    SLOT(core, n_core, NVTX_CBID_CORE_RangePop, range_pop);
    SLOT(core, n_core, NVTX_CBID_CORE_NameCategoryA, name_category_a);
    SLOT(core2, n_core2, NVTX_CBID_CORE2_DomainMarkEx, domain_mark_ex);
    SLOT(core2, n_core2, NVTX_CBID_CORE2_DomainRangeStartEx, domain_range_start_ex);
    SLOT(core2, n_core2, NVTX_CBID_CORE2_DomainRangeEnd, domain_range_end);
    SLOT(core2, n_core2, NVTX_CBID_CORE2_DomainRangePushEx, domain_range_push_ex);
    SLOT(core2, n_core2, NVTX_CBID_CORE2_DomainRangePop, domain_range_pop);
    SLOT(core2, n_core2, NVTX_CBID_CORE2_DomainNameCategoryA, domain_name_category_a);
    SLOT(core2, n_core2, NVTX_CBID_CORE2_DomainRegisterStringA, domain_register_string_a);
    SLOT(core2, n_core2, NVTX_CBID_CORE2_DomainCreateA, domain_create_a);
    SLOT(core2, n_core2, NVTX_CBID_CORE2_DomainDestroy, domain_destroy);
    return 1;
}
