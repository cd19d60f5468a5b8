/* Linked into every shared library of a build on glibc >= 2.38 (CMakeLists.txt, "Portable binaries").
 *
 * From glibc 2.38 the headers bind strtol, strtoul, sscanf and their kin to C23 entry points (__isoc23_*, symbol
 * version GLIBC_2.38) whenever _GNU_SOURCE is defined, which C++ and HIP compilers always define. One such call makes
 * a library, and the wheel that holds it, refuse every older glibc (Debian 12, Ubuntu 22.04, RHEL 9). A forced include
 * cannot undo the binding for HIP: clang's HIP wrapper header includes <stdlib.h> before any -include.
 *
 * So each library gets its own hidden definitions of those entry points, forwarding to the C17 ones every glibc has;
 * the linker binds the library's references to them instead of to glibc 2.38. The C17 functions differ only in not
 * reading a "0b" prefix (and scanf's %b), which nothing in llama.cpp or llama-vq parses. No glibc header is included:
 * they would bind these very calls to __isoc23_* again.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define LLAMA_VQ_HIDDEN __attribute__((visibility("hidden")))

typedef struct _IO_FILE FILE;

extern long strtol(const char *, char **, int);
extern unsigned long strtoul(const char *, char **, int);
extern long long strtoll(const char *, char **, int);
extern unsigned long long strtoull(const char *, char **, int);
extern intmax_t strtoimax(const char *, char **, int);
extern uintmax_t strtoumax(const char *, char **, int);
extern long wcstol(const wchar_t *, wchar_t **, int);
extern unsigned long wcstoul(const wchar_t *, wchar_t **, int);
extern long long wcstoll(const wchar_t *, wchar_t **, int);
extern unsigned long long wcstoull(const wchar_t *, wchar_t **, int);
/* C99's scanf, as glibc's headers name it outside C23 */
extern int __isoc99_vsscanf(const char *, const char *, va_list);
extern int __isoc99_vfscanf(FILE *, const char *, va_list);

LLAMA_VQ_HIDDEN long __isoc23_strtol(const char *s, char **end, int base) { return strtol(s, end, base); }
LLAMA_VQ_HIDDEN unsigned long __isoc23_strtoul(const char *s, char **end, int base) { return strtoul(s, end, base); }
LLAMA_VQ_HIDDEN long long __isoc23_strtoll(const char *s, char **end, int base) { return strtoll(s, end, base); }
LLAMA_VQ_HIDDEN unsigned long long __isoc23_strtoull(const char *s, char **end, int base) {
    return strtoull(s, end, base);
}
LLAMA_VQ_HIDDEN intmax_t __isoc23_strtoimax(const char *s, char **end, int base) { return strtoimax(s, end, base); }
LLAMA_VQ_HIDDEN uintmax_t __isoc23_strtoumax(const char *s, char **end, int base) { return strtoumax(s, end, base); }
LLAMA_VQ_HIDDEN long __isoc23_wcstol(const wchar_t *s, wchar_t **end, int base) { return wcstol(s, end, base); }
LLAMA_VQ_HIDDEN unsigned long __isoc23_wcstoul(const wchar_t *s, wchar_t **end, int base) {
    return wcstoul(s, end, base);
}
LLAMA_VQ_HIDDEN long long __isoc23_wcstoll(const wchar_t *s, wchar_t **end, int base) { return wcstoll(s, end, base); }
LLAMA_VQ_HIDDEN unsigned long long __isoc23_wcstoull(const wchar_t *s, wchar_t **end, int base) {
    return wcstoull(s, end, base);
}
LLAMA_VQ_HIDDEN int __isoc23_vsscanf(const char *s, const char *format, va_list ap) {
    return __isoc99_vsscanf(s, format, ap);
}
LLAMA_VQ_HIDDEN int __isoc23_sscanf(const char *s, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    int n = __isoc99_vsscanf(s, format, ap);
    va_end(ap);
    return n;
}
LLAMA_VQ_HIDDEN int __isoc23_vfscanf(FILE *f, const char *format, va_list ap) { return __isoc99_vfscanf(f, format, ap); }
LLAMA_VQ_HIDDEN int __isoc23_fscanf(FILE *f, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    int n = __isoc99_vfscanf(f, format, ap);
    va_end(ap);
    return n;
}
