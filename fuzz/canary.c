/*
 * Deliberate bugs for fuzz/sanitized.py: each must make the sanitized set-up abort with a
 * report.  If they do not, the sanitizers are not active and a clean fuzz run means nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdlib.h>

static PyObject *
heap_overflow(PyObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    volatile char *p = malloc(8);
    p[7 + n] = 1;              /* one past the end for n == 1 */
    free((void *)p);
    Py_RETURN_NONE;
}

static PyObject *
signed_overflow(PyObject *self, PyObject *arg)
{
    volatile int x = INT_MAX;
    int y = x + (int)PyLong_AsLong(arg);   /* overflows for n >= 1 */
    return PyLong_FromLong(y);
}

static PyMethodDef methods[] = {
    {"heap_overflow", heap_overflow, METH_O, NULL},
    {"signed_overflow", signed_overflow, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fuzz_canary", NULL, -1, methods};

PyMODINIT_FUNC
PyInit_fuzz_canary(void)
{
    return PyModule_Create(&module);
}
