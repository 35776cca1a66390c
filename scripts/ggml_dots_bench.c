/* ggml_dots_bench.c — one thread, one activation row: kvbench's quant_vec_dot_multi against llama.cpp's ggml_vec_dot_*
 * on a ROWS x COLS matrix (default 8960 x 1536, Qwen2.5-1.5B's FFN), best of REPS; built and run by
 * scripts/ggml_dots_check.sh LLAMA_CPP_DIR --bench [ROWS COLS REPS]. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels/cpu/quant.h"
#define GGML_DOT(name) void name(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
void quantize_row_q8_K(const float *x, void *y, int64_t k);
void quantize_row_q8_1(const float *x, void *y, int64_t k);
void quantize_row_q8_0(const float *x, void *y, int64_t k);
GGML_DOT(ggml_vec_dot_q4_K_q8_K) GGML_DOT(ggml_vec_dot_q6_K_q8_K) GGML_DOT(ggml_vec_dot_q5_K_q8_K) GGML_DOT(ggml_vec_dot_q4_1_q8_1)
typedef void (*dotfn)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int rows=argc>1?atoi(argv[1]):8960, cols=argc>2?atoi(argv[2]):1536, reps=argc>3?atoi(argv[3]):20;
  struct {ggml_type t; dotfn f;} c[]={{GGML_T_Q4_K,ggml_vec_dot_q4_K_q8_K},{GGML_T_Q6_K,ggml_vec_dot_q6_K_q8_K},{GGML_T_Q5_K,ggml_vec_dot_q5_K_q8_K},{GGML_T_Q4_1,ggml_vec_dot_q4_1_q8_1}};
  float *w=malloc(sizeof(float)*cols), *x=malloc(sizeof(float)*cols), *out=malloc(sizeof(float)*rows);
  for(int i=0;i<cols;i++){w[i]=rand()/(float)RAND_MAX-0.5f;x[i]=rand()/(float)RAND_MAX-0.5f;}
  for(unsigned k=0;k<sizeof c/sizeof*c;k++){
    size_t rb=ggml_row_bytes(c[k].t,cols); uint8_t *W=malloc(rb*rows); for(int r=0;r<rows;r++) quant_quantize_row(c[k].t,w,W+r*rb,cols);
    uint8_t act[65536]; quant_act_quantize(c[k].t,x,act,cols);
    double best1=1e9,best2=1e9;
    for(int rep=0;rep<reps;rep++){
      double t0=now(); for(int r=0;r<rows;r++) quant_vec_dot_multi(c[k].t,cols,W+r*rb,act,0,1,&out[r]); double t1=now();
      for(int r=0;r<rows;r++) c[k].f(cols,&out[r],0,W+r*rb,0,act,0,1); double t2=now();
      if(t1-t0<best1)best1=t1-t0; if(t2-t1<best2)best2=t2-t1;}
    printf("%-5s %dx%d  kvbench %.3f ms (%.1f GB/s)  ggml %.3f ms (%.1f GB/s)  ratio %.2f\n",ggml_type_name(c[k].t),rows,cols,best1*1e3,rb*rows/best1/1e9,best2*1e3,rb*rows/best2/1e9,best2/best1);
    free(W);}
}
