/* narrow.h — the CPU backend's narrow-key ops (kernels/backend.h, "keys narrower than values": gather_cols,
 * attention_narrow). */
#ifndef KVB_CPU_NARROW_H
#define KVB_CPU_NARROW_H

#include "kernels/backend.h"

/* Set be's gather_cols and attention_narrow to the CPU implementations (no backend state). */
void cpu_install_narrow_ops(kvb_backend *be);

#endif
