/* test_svg.c — the hand-written SVG charts (reports/svg.h): every document is well-formed XML (checked by a small
 * parser here: one root, matched tags, quoted attributes, only the XML entities), labels are present and escaped,
 * every coordinate lies within the viewBox, and points land where the axes put them, computed by hand from the
 * plot frame (x 80..590, y 50..410 of an 820 x 480 canvas) and the nice tick steps (1, 2 or 5 x 10^k, range / 5). */
#include <CUnit/Basic.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_common.h"
#include "reports/svg.h"

/* ---- a minimal XML well-formedness check ---- */

static const char *xml_err;

static int is_name_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_' || c == ':' || c == '.'; }

/* Character data or an attribute value up to stop: no '<', and '&' only as &amp; &lt; &gt; &quot; &apos; &#N; */
static const char *xml_text(const char *p, char stop) {
    static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    while (*p && *p != stop) {
        if (*p == '<' && stop == '"') return xml_err = "'<' in an attribute value", NULL;
        if (*p == '&') {
            size_t k = 0, n = 0;
            for (; k < 5; k++)
                if (!strncmp(p, ents[k], n = strlen(ents[k]))) break;
            if (k == 5 && p[1] == '#') {
                n = 2;
                while (isdigit((unsigned char)p[n])) n++;
                if (n == 2 || p[n] != ';') return xml_err = "bad character reference", NULL;
                n++;
            } else if (k == 5) {
                return xml_err = "'&' outside an entity", NULL;
            }
            p += n;
            continue;
        }
        p++;
    }
    return p;
}

/* 1 when doc is one well-formed element (whitespace around it allowed). */
static int xml_well_formed(const char *doc) {
    const char *stack[64];
    size_t stack_len[64];
    int depth = 0, roots = 0;
    const char *p = doc;
    xml_err = NULL;
    while (*p) {
        if (*p != '<') {
            const char *q = xml_text(p, '<');
            if (!q) return 0;
            for (const char *c = p; c < q; c++)
                if (depth == 0 && !isspace((unsigned char)*c)) return xml_err = "text outside the root", 0;
            p = q;
            continue;
        }
        if (p[1] == '/') { /* closing tag */
            const char *n = p + 2, *e = n;
            while (is_name_char(*e)) e++;
            if (depth == 0 || (size_t)(e - n) != stack_len[depth - 1] || strncmp(n, stack[depth - 1], (size_t)(e - n)))
                return xml_err = "closing tag does not match", 0;
            while (isspace((unsigned char)*e)) e++;
            if (*e != '>') return xml_err = "bad closing tag", 0;
            depth--;
            p = e + 1;
            continue;
        }
        const char *n = p + 1, *e = n;
        while (is_name_char(*e)) e++;
        if (e == n) return xml_err = "empty tag name", 0;
        if (depth == 0 && roots++) return xml_err = "more than one root", 0;
        const char *a = e;
        for (;;) { /* attributes: name="value" */
            int sp = 0;
            while (isspace((unsigned char)*a)) a++, sp = 1;
            if (*a == '>' || (a[0] == '/' && a[1] == '>')) break;
            const char *an = a;
            while (is_name_char(*a)) a++;
            if (!sp || a == an || a[0] != '=' || a[1] != '"') return xml_err = "bad attribute", 0;
            a = xml_text(a + 2, '"');
            if (!a || *a != '"') return xml_err = xml_err ? xml_err : "unterminated attribute", 0;
            a++;
        }
        if (*a == '/') {
            p = a + 2;
        } else {
            if (depth == 64) return xml_err = "too deep", 0;
            stack[depth] = n, stack_len[depth++] = (size_t)(e - n);
            p = a + 1;
        }
    }
    if (depth) return xml_err = "unclosed element", 0;
    return roots == 1 ? 1 : (xml_err = "no root", 0);
}

/* ---- coordinates ---- */

static double vb_w, vb_h;

/* 1 when every absolute coordinate of the document (x, y, x1, y1, x2, y2 attributes; polyline points; path M and
 * L points) is within the viewBox, and sets vb_w, vb_h. */
static int coords_within_viewbox(const char *svg) {
    if (sscanf(strstr(svg, "viewBox=\"") + 9, "0 0 %lf %lf", &vb_w, &vb_h) != 2) return 0;
    static const char *const attrs[] = {" x=\"", " y=\"", " x1=\"", " y1=\"", " x2=\"", " y2=\""};
    for (int k = 0; k < 6; k++)
        for (const char *p = strstr(svg, attrs[k]); p; p = strstr(p + 1, attrs[k])) {
            double v = atof(p + strlen(attrs[k]));
            if (v < 0 || v > ((k & 1) ? vb_h : vb_w)) return fprintf(stderr, "\n  %s%g out of the viewBox\n", attrs[k], v), 0;
        }
    for (const char *p = strstr(svg, "points=\""); p; p = strstr(p + 1, "points=\"")) {
        double x, y;
        int used;
        for (const char *q = p + 8; sscanf(q, "%lf,%lf %n", &x, &y, &used) == 2; q += used)
            if (x < 0 || x > vb_w || y < 0 || y > vb_h) return fprintf(stderr, "\n  point %g,%g out of the viewBox\n", x, y), 0;
    }
    for (const char *p = strstr(svg, " d=\""); p; p = strstr(p + 1, " d=\""))
        for (const char *q = p + 4; *q && *q != '"'; q++)
            if (*q == 'M' || *q == 'L') {
                double x, y;
                if (sscanf(q + 1, "%lf,%lf", &x, &y) != 2 || x < 0 || x > vb_w || y < 0 || y > vb_h)
                    return fprintf(stderr, "\n  path point %.20s out of the viewBox\n", q), 0;
            }
    return 1;
}

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void check_document(const char *svg) {
    CU_ASSERT_FATAL(svg != NULL);
    int ok = xml_well_formed(svg);
    CU_ASSERT(ok);
    if (!ok) fprintf(stderr, "\n  not well-formed: %s\n", xml_err);
    CU_ASSERT(coords_within_viewbox(svg));
}

/* The checker itself rejects what it must. */
static void test_xml_checker_rejects_malformed_documents(void) {
    CU_ASSERT(xml_well_formed("<svg a=\"1\"><g><text>a &amp; b &#38;</text></g><rect/></svg>\n"));
    static const char *const bad[] = {"<svg><g></svg>", "<svg>a & b</svg>", "<svg a=1/>", "<svg a=\"<\"/>",
                                      "<svg/><svg/>", "<svg><text>x</txt></svg>", "<svg>", "x<svg/>"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CU_ASSERT(!xml_well_formed(bad[i]));
}

/* Two points on nice axes: x 0..10 in steps of 2, y 0..100 in steps of 20; (0, 0) is the frame's bottom left
 * (80, 410) and (10, 100) its top right (590, 50). Title, axis labels and legend are escaped text. */
static void test_line_chart_puts_points_where_the_axes_say(void) {
    double x[2] = {0, 10}, y[2] = {0, 100};
    kvb_svg_series se = {"snapkv <30%> & \"h2o\"", x, y, 2, NAN};
    kvb_svg_chart c = {"Accuracy <vs> budget & more", "KV kept (%)", "score", 0, NAN, NAN, NAN, NAN, &se, 1};
    char *svg = kvb_svg_line_chart(&c);
    check_document(svg);
    CU_ASSERT(vb_w == 820 && vb_h == 480);
    CU_ASSERT(strstr(svg, "points=\"80.00,410.00 590.00,50.00 \"") != NULL);
    CU_ASSERT(strstr(svg, ">Accuracy &lt;vs&gt; budget &amp; more</text>") != NULL);
    CU_ASSERT(strstr(svg, ">KV kept (%)</text>") && strstr(svg, ">score</text>"));
    CU_ASSERT(strstr(svg, ">snapkv &lt;30%&gt; &amp; &quot;h2o&quot;</text>") != NULL); /* the legend */
    CU_ASSERT(strstr(svg, "<title>snapkv &lt;30%&gt; &amp; &quot;h2o&quot;: (10, 100)</title>") != NULL);
    static const char *const ticks[] = {">0</text>", ">2</text>", ">4</text>", ">6</text>", ">8</text>", ">10</text>",
                                        ">20</text>", ">40</text>", ">60</text>", ">80</text>", ">100</text>"};
    for (size_t i = 0; i < sizeof ticks / sizeof *ticks; i++) CU_ASSERT(strstr(svg, ticks[i]) != NULL);
    CU_ASSERT(count_of(svg, ">0</text>") == 2); /* both axes start at 0 */
    free(svg);
}

/* A log2 x axis puts powers of two at equal steps with "k" labels (1024 .. 8192: 2^10 .. 2^13, so 2048 is a
 * third of the way); NAN points are left out of the line and the markers; a reference line is dashed across
 * the frame at its y. */
static void test_log2_axis_nan_points_and_reference_line(void) {
    double x[4] = {1024, 2048, NAN, 8192}, y[4] = {10, 20, 30, 40};
    kvb_svg_series se[2] = {{"ttft", x, y, 4, NAN}, {"full", NULL, NULL, 0, 25}};
    kvb_svg_chart c = {"Latency", "context (tokens)", "ms", 1, NAN, NAN, NAN, NAN, se, 2};
    char *svg = kvb_svg_line_chart(&c);
    check_document(svg);
    /* y: 10..40 -> step 10 (30 / 5 = 6 -> 10), axis 10..40: y(10) = 410, y(40) = 50, y(25) = 230 */
    CU_ASSERT(strstr(svg, "points=\"80.00,410.00 250.00,290.00 590.00,50.00 \"") != NULL);
    CU_ASSERT(strstr(svg, ">1k</text>") && strstr(svg, ">2k</text>") && strstr(svg, ">4k</text>") && strstr(svg, ">8k</text>"));
    CU_ASSERT(count_of(svg, "<title>ttft: ") == 3);
    CU_ASSERT(strstr(svg, "<line x1=\"80.00\" y1=\"230.00\" x2=\"590.00\" y2=\"230.00\" stroke=\"#ff7f0e\" stroke-width=\"2\" "
                          "stroke-dasharray=\"6 4\"/>") != NULL);
    free(svg);
}

/* Without data the chart is still a well-formed document with its labels. */
static void test_empty_chart_is_well_formed(void) {
    kvb_svg_chart c = {"Nothing yet", "x", "y", 0, NAN, NAN, NAN, NAN, NULL, 0};
    char *svg = kvb_svg_line_chart(&c);
    check_document(svg);
    CU_ASSERT(strstr(svg, ">Nothing yet</text>") && !strstr(svg, "<polyline"));
    free(svg);
}

/* Each heatmap cell is coloured red (0) -> yellow (0.5) -> green (1), grey without data, and shows the score
 * x100 ("-" without data); axis values and labels are present and escaped. */
static void test_heatmap_cells_colours_and_labels(void) {
    double xs[2] = {1000, 2000}, ys[2] = {0, 50}, v[4] = {0, 0.5, 1, NAN};
    char *svg = kvb_svg_heatmap("NIAH <snapkv> & co", "context length", "depth (%)", 2, xs, 2, ys, v);
    check_document(svg);
    static const char *const cells[4][2] = {{"fill=\"#d73027\"", ">0</text>"}, {"fill=\"#fee08b\"", ">50</text>"},
                                            {"fill=\"#1a9850\"", ">100</text>"}, {"fill=\"#d9d9d9\"", ">-</text>"}};
    for (int i = 0; i < 4; i++) CU_ASSERT(strstr(svg, cells[i][0]) && strstr(svg, cells[i][1]));
    CU_ASSERT(strstr(svg, ">1000</text>") && strstr(svg, ">2000</text>") && strstr(svg, ">50</text>"));
    CU_ASSERT(strstr(svg, ">NIAH &lt;snapkv&gt; &amp; co</text>") && strstr(svg, ">depth (%)</text>"));
    CU_ASSERT(count_of(svg, "<rect ") == 1 + 4 + 20); /* background, cells, colour bar */
    free(svg);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("svg", NULL, NULL);
    CU_add_test(s, "the XML checker rejects malformed documents", test_xml_checker_rejects_malformed_documents);
    CU_add_test(s, "line chart puts points where the axes say", test_line_chart_puts_points_where_the_axes_say);
    CU_add_test(s, "log2 axis, NAN points and a reference line", test_log2_axis_nan_points_and_reference_line);
    CU_add_test(s, "an empty chart is well-formed", test_empty_chart_is_well_formed);
    CU_add_test(s, "heatmap cells: colours and labels", test_heatmap_cells_colours_and_labels);
    return util_run_suites();
}
