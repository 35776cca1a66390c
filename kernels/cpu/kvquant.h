/* kvquant.h — the CPU backend's quantized-KV ops (kernels/backend.h, "KIVI": quant_groups, attention_quant). */
#ifndef KVB_CPU_KVQUANT_H
#define KVB_CPU_KVQUANT_H

#include "kernels/backend.h"

/* Set be's quant_groups and attention_quant to the CPU implementations (no backend state). */
void cpu_install_kvquant_ops(kvb_backend *be);

#endif
