/* gguf_print.h — human-readable dump of a GGUF file (what `kvbench inspect` prints). */
#ifndef KVB_GGUF_PRINT_H
#define KVB_GGUF_PRINT_H

#include <stdio.h>

#include "engine/gguf.h"

/* Header, every metadata key with type and value (arrays: count and the first max_array_items items),
 * the tensor table and bytes per tensor type. */
void gguf_print(const gguf_file *f, FILE *out, int max_array_items);

#endif
