/* svg.h — the report's charts as plain SVG text, written by hand: a line chart (axes, ticks, grid, labels,
 * legend, optional log2 x axis and horizontal reference lines) and a heatmap with a colour bar. No library;
 * every label is XML-escaped. */
#ifndef KVB_SVG_H
#define KVB_SVG_H

/* One line of a chart: n points (x[i], y[i]); NAN points are skipped. A series with n == 0 and a finite
 * hline is drawn as a dashed horizontal reference line at y = hline. */
typedef struct {
    const char *name;
    const double *x, *y;
    int n;
    double hline;
} kvb_svg_series;

typedef struct {
    const char *title, *x_label, *y_label;
    int x_log2;                  /* log2 x axis with ticks at powers of two */
    double x_min, x_max;         /* fixed x range (linear axis), or NAN for automatic */
    double y_min, y_max;         /* fixed y range, or NAN for automatic */
    const kvb_svg_series *series;
    int n_series;
} kvb_svg_chart;

/* The chart as an SVG document (malloc'd), or NULL when out of memory. */
char *kvb_svg_line_chart(const kvb_svg_chart *chart);
/* A heatmap of v[iy * nx + ix] in [0, 1] (NAN = no data, grey) over x labels xs[nx] (columns) and y labels
 * ys[ny] (rows, top to bottom); each cell is coloured red -> yellow -> green and shows round(v x 100).
 * malloc'd SVG, or NULL when out of memory. */
char *kvb_svg_heatmap(const char *title, const char *x_label, const char *y_label, int nx, const double *xs, int ny,
                      const double *ys, const double *v);

#endif
