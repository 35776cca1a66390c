/* svg.c — hand-written SVG charts (see svg.h). Text goes through open_memstream; coordinates are in
 * pixels with two decimals, so the same data gives byte-identical files. */
#include "reports/svg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static const char *const PALETTE[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
enum { N_PALETTE = sizeof PALETTE / sizeof *PALETTE };

static void esc(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void text(FILE *f, double x, double y, const char *anchor, const char *extra, const char *s) {
    fprintf(f, "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"%s\"%s%s>", x, y, anchor, extra ? " " : "", extra ? extra : "");
    esc(f, s);
    fputs("</text>\n", f);
}

/* Width in pixels a bold 15 px sans-serif title needs: 0.62 em per character (UTF-8 continuation bytes do
 * not count), a generous average for Latin text, plus margins. */
static int title_px(const char *title) {
    int n = 0;
    for (const char *p = title; p && *p; p++) n += ((unsigned char)*p & 0xC0) != 0x80;
    return (int)ceil(n * 15 * 0.62) + 40;
}

static void open_doc(FILE *f, int w, int h, const char *title) {
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
            w, h, w, h, w, h);
    text(f, w / 2.0, 24, "middle", "font-size=\"15\" font-weight=\"bold\"", title);
}

/* Close the document and its open_memstream stream: the text, or NULL (freed) when a write failed. */
static char *close_doc(FILE *f, char **buf) {
    fputs("</svg>\n", f);
    int bad = ferror(f);
    if (fclose(f) || bad) {
        free(*buf);
        *buf = NULL;
    }
    return *buf;
}

/* ---- axes ---- */

typedef struct { double lo, hi, step; int log2; } axis;

static double nice_step(double range) {
    double raw = range / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

static axis linear_axis(double lo, double hi, double fix_lo, double fix_hi) {
    if (!isfinite(lo)) lo = 0, hi = 1;
    if (hi - lo < 1e-9) lo -= fabs(lo) > 1 ? fabs(lo) * 0.1 : 1, hi += fabs(hi) > 1 ? fabs(hi) * 0.1 : 1;
    axis a = {isfinite(fix_lo) ? fix_lo : lo, isfinite(fix_hi) ? fix_hi : hi, 0, 0};
    a.step = nice_step(a.hi - a.lo);
    if (!isfinite(fix_lo)) a.lo = floor(a.lo / a.step) * a.step;
    if (!isfinite(fix_hi)) a.hi = ceil(a.hi / a.step) * a.step;
    return a;
}

static axis log2_axis(double lo, double hi) {
    if (!isfinite(lo) || lo <= 0) lo = 1, hi = 2;
    axis a = {floor(log2(lo)), ceil(log2(hi)), 1, 1};
    if (a.hi <= a.lo) a.hi = a.lo + 1;
    return a;
}

static double axis_frac(const axis *a, double v) { return ((a->log2 ? log2(v) : v) - a->lo) / (a->hi - a->lo); }

static void tick_label(char *buf, size_t cap, const axis *a, double t) {
    if (!a->log2) {
        snprintf(buf, cap, "%g", fabs(t) < a->step * 1e-9 ? 0.0 : t);
        return;
    }
    double v = exp2(t);
    if (v >= 1024 && fmod(v, 1024) == 0) snprintf(buf, cap, "%gk", v / 1024);
    else snprintf(buf, cap, "%g", v);
}

typedef struct { double left, top, right, bottom; } frame;

static double px(const frame *fr, const axis *a, double v) { return fr->left + axis_frac(a, v) * (fr->right - fr->left); }
static double py(const frame *fr, const axis *a, double v) { return fr->bottom - axis_frac(a, v) * (fr->bottom - fr->top); }

static void draw_axes(FILE *f, const frame *fr, const axis *ax, const axis *ay, const kvb_svg_chart *c) {
    char lab[32];
    for (double t = ax->lo; t <= ax->hi + ax->step * 1e-6; t += ax->step) {
        double x = fr->left + (t - ax->lo) / (ax->hi - ax->lo) * (fr->right - fr->left);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#e0e0e0\"/>\n", x, fr->top, x, fr->bottom);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n", x, fr->bottom, x, fr->bottom + 5);
        tick_label(lab, sizeof lab, ax, t);
        text(f, x, fr->bottom + 18, "middle", NULL, lab);
    }
    for (double t = ay->lo; t <= ay->hi + ay->step * 1e-6; t += ay->step) {
        double y = fr->bottom - (t - ay->lo) / (ay->hi - ay->lo) * (fr->bottom - fr->top);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#e0e0e0\"/>\n", fr->left, y, fr->right, y);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"black\"/>\n", fr->left - 5, y, fr->left, y);
        tick_label(lab, sizeof lab, ay, t);
        text(f, fr->left - 8, y + 4, "end", NULL, lab);
    }
    fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"none\" stroke=\"black\"/>\n", fr->left,
            fr->top, fr->right - fr->left, fr->bottom - fr->top);
    text(f, (fr->left + fr->right) / 2, fr->bottom + 42, "middle", NULL, c->x_label);
    char rot[96];
    snprintf(rot, sizeof rot, "transform=\"rotate(-90 %.2f %.2f)\"", fr->left - 48, (fr->top + fr->bottom) / 2);
    text(f, fr->left - 48, (fr->top + fr->bottom) / 2, "middle", rot, c->y_label);
}

/* ---- line chart ---- */

static void data_range(const kvb_svg_chart *c, double *xlo, double *xhi, double *ylo, double *yhi) {
    *xlo = *ylo = INFINITY, *xhi = *yhi = -INFINITY;
    for (int s = 0; s < c->n_series; s++) {
        const kvb_svg_series *se = &c->series[s];
        if (se->n == 0 && isfinite(se->hline)) *ylo = fmin(*ylo, se->hline), *yhi = fmax(*yhi, se->hline);
        for (int i = 0; i < se->n; i++) {
            if (!isfinite(se->x[i]) || !isfinite(se->y[i]) || (c->x_log2 && se->x[i] <= 0)) continue;
            *xlo = fmin(*xlo, se->x[i]), *xhi = fmax(*xhi, se->x[i]);
            *ylo = fmin(*ylo, se->y[i]), *yhi = fmax(*yhi, se->y[i]);
        }
    }
}

/* Series k's point marker: hollow, a shape and size of its own (circle, square, triangle, diamond, inverted
 * triangle; smaller for later series), so points of several series at the same place stay visible as nested
 * outlines instead of the last one covering the others. */
static void marker(FILE *f, int k, double x, double y, const char *color) {
    double r = 7.0 - 1.0 * (k % 5);
    fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\" d=\"", color);
    switch (k % 5) {
    case 0: fprintf(f, "M%.2f,%.2f a%.2f,%.2f 0 1,0 %.2f,0 a%.2f,%.2f 0 1,0 %.2f,0", x - r, y, r, r, 2 * r, r, r, -2 * r); break;
    case 1: fprintf(f, "M%.2f,%.2f h%.2f v%.2f h%.2f Z", x - r, y - r, 2 * r, 2 * r, -2 * r); break;
    case 2: fprintf(f, "M%.2f,%.2f L%.2f,%.2f L%.2f,%.2f Z", x, y - r, x + r, y + r * 0.8, x - r, y + r * 0.8); break;
    case 3: fprintf(f, "M%.2f,%.2f L%.2f,%.2f L%.2f,%.2f L%.2f,%.2f Z", x, y - r, x + r, y, x, y + r, x - r, y); break;
    default: fprintf(f, "M%.2f,%.2f L%.2f,%.2f L%.2f,%.2f Z", x, y + r, x + r, y - r * 0.8, x - r, y - r * 0.8); break;
    }
    fputs("\"", f);
}

/* Points of a series that can be drawn (finite, and positive on a log2 x axis). */
static int drawn_points(const kvb_svg_series *se, int x_log2) {
    int n = 0;
    for (int i = 0; i < se->n; i++) n += isfinite(se->x[i]) && isfinite(se->y[i]) && (!x_log2 || se->x[i] > 0);
    return n;
}

static void draw_series(FILE *f, const frame *fr, const axis *ax, const axis *ay, const kvb_svg_series *se, int k, const char *color) {
    if (se->n == 0) {
        if (!isfinite(se->hline)) return;
        double y = py(fr, ay, se->hline);
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"6 4\"/>\n",
                fr->left, y, fr->right, y, color);
        return;
    }
    if (drawn_points(se, ax->log2) >= 2) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", color);
        for (int i = 0; i < se->n; i++)
            if (isfinite(se->x[i]) && isfinite(se->y[i]) && (!ax->log2 || se->x[i] > 0))
                fprintf(f, "%.2f,%.2f ", px(fr, ax, se->x[i]), py(fr, ay, se->y[i]));
        fputs("\"/>\n", f);
    }
    for (int i = 0; i < se->n; i++) {
        if (!isfinite(se->x[i]) || !isfinite(se->y[i]) || (ax->log2 && se->x[i] <= 0)) continue;
        marker(f, k, px(fr, ax, se->x[i]), py(fr, ay, se->y[i]), color);
        fputs("><title>", f);
        esc(f, se->name);
        fprintf(f, ": (%g, %.3g)</title></path>\n", se->x[i], se->y[i]);
    }
}

/* The legend shows what the plot shows: a dashed line for a reference line, a marker for points, a line
 * through the marker only when the series has a line; series with nothing drawn are left out. */
static void draw_legend(FILE *f, const frame *fr, const kvb_svg_chart *c) {
    double x = fr->right + 16, y = fr->top + 8;
    for (int s = 0; s < c->n_series; s++) {
        const kvb_svg_series *se = &c->series[s];
        const char *color = PALETTE[s % N_PALETTE];
        int pts = drawn_points(se, c->x_log2);
        if (se->n == 0 && !isfinite(se->hline)) continue;
        if (se->n > 0 && pts == 0) continue;
        if (se->n == 0 || pts >= 2)
            fprintf(f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", x, y,
                    x + 22, y, color, se->n == 0 ? " stroke-dasharray=\"6 4\"" : "");
        if (pts) marker(f, s, x + 11, y, color), fputs("/>\n", f);
        text(f, x + 28, y + 4, "start", NULL, se->name);
        y += 20;
    }
}

char *kvb_svg_line_chart(const kvb_svg_chart *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    const int w = 820, h = 480;
    frame fr = {80, 50, w - 230, h - 70};
    double xlo, xhi, ylo, yhi;
    data_range(c, &xlo, &xhi, &ylo, &yhi);
    axis ax = c->x_log2 ? log2_axis(xlo, xhi) : linear_axis(xlo, xhi, c->x_min, c->x_max);
    axis ay = linear_axis(ylo, yhi, c->y_min, c->y_max);
    open_doc(f, w, h, c->title);
    draw_axes(f, &fr, &ax, &ay, c);
    for (int s = 0; s < c->n_series; s++) draw_series(f, &fr, &ax, &ay, &c->series[s], s, PALETTE[s % N_PALETTE]);
    draw_legend(f, &fr, c);
    return close_doc(f, &buf);
}

/* ---- heatmap ---- */

/* red (0) -> yellow (0.5) -> green (1), the usual needle-in-a-haystack scale */
static void heat_color(double v, char *buf, size_t cap) {
    static const double stops[3][3] = {{215, 48, 39}, {254, 224, 139}, {26, 152, 80}};
    if (!isfinite(v)) {
        snprintf(buf, cap, "#d9d9d9");
        return;
    }
    v = fmin(1, fmax(0, v));
    int k = v < 0.5 ? 0 : 1;
    double t = (v - 0.5 * k) * 2, rgb[3];
    for (int i = 0; i < 3; i++) rgb[i] = stops[k][i] + t * (stops[k + 1][i] - stops[k][i]);
    snprintf(buf, cap, "#%02x%02x%02x", (int)lround(rgb[0]), (int)lround(rgb[1]), (int)lround(rgb[2]));
}

static void heat_cells(FILE *f, double left, double top, double cw, double ch, int nx, int ny, const double *v) {
    char color[16], lab[16];
    for (int iy = 0; iy < ny; iy++)
        for (int ix = 0; ix < nx; ix++) {
            double val = v[(size_t)iy * (size_t)nx + (size_t)ix], x = left + ix * cw, y = top + iy * ch;
            heat_color(val, color, sizeof color);
            fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" stroke=\"white\"/>\n", x, y, cw, ch, color);
            if (isfinite(val)) snprintf(lab, sizeof lab, "%.0f", val * 100);
            else snprintf(lab, sizeof lab, "-");
            text(f, x + cw / 2, y + ch / 2 + 4, "middle", NULL, lab);
        }
}

static void heat_bar(FILE *f, double x, double top, double height) {
    char color[16], lab[16];
    for (int i = 0; i < 20; i++) {
        heat_color(1 - (i + 0.5) / 20, color, sizeof color);
        fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"16\" height=\"%.2f\" fill=\"%s\"/>\n", x, top + i * height / 20, height / 20 + 0.5, color);
    }
    for (int i = 0; i <= 4; i++) {
        snprintf(lab, sizeof lab, "%d", 100 - 25 * i);
        text(f, x + 22, top + i * height / 4 + 4, "start", NULL, lab);
    }
}

char *kvb_svg_heatmap(const char *title, const char *x_label, const char *y_label, int nx, const double *xs, int ny,
                      const double *ys, const double *v) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    /* rows at least 30 px, and the grid at least 110 px tall so the rotated y label and the colour bar fit */
    const double cw = 64, ch = ny > 0 && ny * 30 < 110 ? 110.0 / ny : 30, top = 50;
    double left = 90;
    int w = (int)(left + nx * cw + 90), h = (int)(top + (ny * ch > 100 ? ny * ch : 100) + 70);
    if (w < 360) w = 360;
    if (w < title_px(title)) { /* a long method@budget must not clip the title: widen, keep the grid centred */
        left += (title_px(title) - w) / 2.0;
        w = title_px(title);
    }
    open_doc(f, w, h, title);
    heat_cells(f, left, top, cw, ch, nx, ny, v);
    char lab[32];
    for (int ix = 0; ix < nx; ix++) {
        snprintf(lab, sizeof lab, "%g", xs[ix]);
        text(f, left + (ix + 0.5) * cw, top + ny * ch + 18, "middle", NULL, lab);
    }
    for (int iy = 0; iy < ny; iy++) {
        snprintf(lab, sizeof lab, "%g", ys[iy]);
        text(f, left - 8, top + (iy + 0.5) * ch + 4, "end", NULL, lab);
    }
    text(f, left + nx * cw / 2, top + ny * ch + 44, "middle", NULL, x_label);
    char rot[96];
    snprintf(rot, sizeof rot, "transform=\"rotate(-90 %.2f %.2f)\"", left - 52, top + ny * ch / 2);
    text(f, left - 52, top + ny * ch / 2, "middle", rot, y_label);
    heat_bar(f, left + nx * cw + 20, top, ny * ch > 100 ? ny * ch : 100);
    return close_doc(f, &buf);
}
