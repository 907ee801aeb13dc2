/* The simulator's token emitter: a thread that writes each step's SSE chunks to their sockets at the
 * step's scheduled time, without the GIL.
 *
 * Why in C: at 2,000 streams the simulator writes 50,000 chunks a second, one send() each, and the
 * kernel's loopback send is over half of the event loop's time (docs/performance.md). Written from the
 * loop, a step's burst waits for whatever the loop is doing when it falls due (a burst of new
 * requests, another instance's planning), and the loop runs at ~95% of a core. This thread takes the
 * sends off the loop: the loop hands over a step's chunks when it plans the step (40 ms ahead at that
 * load), and the thread sleeps on an absolute monotonic deadline (timer slack 1 us) and writes them.
 *
 * Sockets are given as file descriptors that the caller dup()ed for the stream and keeps open until
 * every batch that names them has been collected, so a descriptor is never reused under a pending
 * write. A write that falls short (the client is not reading: EAGAIN, or a partial send) marks the
 * descriptor blocked: later chunks for it are not attempted, and the caller writes the rest through
 * its transport, in order. Nothing here touches a Python object outside the GIL.
 *
 * With realtime=True the thread asks for SCHED_FIFO at the lowest real-time priority (it gets it where
 * the process may: root, CAP_SYS_NICE or an RLIMIT_RTPRIO): on a machine whose cores are all busy (the
 * loop, the clients) a normal thread woken at its deadline can wait milliseconds for a core, and its
 * duty is short and bounded (a burst of sends, then sleep). `priority` says what it got.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 1048576

typedef struct Batch {
    struct Batch *next;
    double start;       /* CLOCK_MONOTONIC seconds: when the first write is due */
    double woke;        /* when the thread took the batch up */
    long long id;
    Py_ssize_t n;
    int *fds;
    Py_ssize_t *offsets; /* n + 1 offsets into data */
    char *data;
    double *times;      /* per chunk: when its send() returned */
    Py_ssize_t *sent;   /* per chunk: bytes written, or -errno (-EAGAIN when skipped as blocked) */
} Batch;

typedef struct {
    PyObject_HEAD
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    Batch *pending;     /* by start time */
    Batch *done_head;
    Batch *done_tail;
    int notify_fd;      /* an eventfd: written once per finished batch */
    int stopping;
    int running;
    int realtime;       /* SCHED_FIFO was granted */
    long long next_id;
    unsigned char *blocked; /* by descriptor */
} Emitter;

static double monotonic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void batch_free(Batch *b) {
    if (b == NULL) return;
    free(b->fds);
    free(b->offsets);
    free(b->data);
    free(b->times);
    free(b->sent);
    free(b);
}

static void write_batch(Emitter *self, Batch *b) {
    b->woke = monotonic_now();
    for (Py_ssize_t i = 0; i < b->n; i++) {
        int fd = b->fds[i];
        Py_ssize_t length = b->offsets[i + 1] - b->offsets[i];
        if (__atomic_load_n(&self->blocked[fd], __ATOMIC_ACQUIRE)) {
            b->sent[i] = -EAGAIN;
            b->times[i] = monotonic_now();
            continue;
        }
        ssize_t r = send(fd, b->data + b->offsets[i], (size_t)length, MSG_DONTWAIT | MSG_NOSIGNAL);
        b->times[i] = monotonic_now();
        if (r < 0) {
            b->sent[i] = -errno;
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                b->sent[i] = -EAGAIN;
                __atomic_store_n(&self->blocked[fd], 1, __ATOMIC_RELEASE);
            }
        } else {
            b->sent[i] = r;
            if (r < length) __atomic_store_n(&self->blocked[fd], 1, __ATOMIC_RELEASE);
        }
    }
}

static void *emitter_main(void *arg) {
    Emitter *self = (Emitter *)arg;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* wake within a microsecond of the deadline, not 50 */
    prctl(PR_SET_NAME, "sim-emitter", 0, 0, 0); /* for top -H, perf and /proc/PID/task */
    pthread_mutex_lock(&self->lock);
    while (!self->stopping) {
        Batch *head = self->pending;
        if (head == NULL) {
            pthread_cond_wait(&self->cond, &self->lock);
            continue;
        }
        if (head->start > monotonic_now()) {
            struct timespec until;
            double whole = (double)(long long)head->start;
            until.tv_sec = (time_t)whole;
            until.tv_nsec = (long)((head->start - whole) * 1e9);
            pthread_cond_timedwait(&self->cond, &self->lock, &until);
            continue; /* re-read: an earlier batch may have come in, or a stop */
        }
        self->pending = head->next;
        head->next = NULL;
        pthread_mutex_unlock(&self->lock);
        write_batch(self, head);
        pthread_mutex_lock(&self->lock);
        if (self->done_tail) self->done_tail->next = head; else self->done_head = head;
        self->done_tail = head;
        uint64_t one = 1;
        ssize_t ignored = write(self->notify_fd, &one, sizeof one);
        (void)ignored;
    }
    pthread_mutex_unlock(&self->lock);
    return NULL;
}

static int Emitter_init(Emitter *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"notify_fd", "realtime", NULL};
    int notify_fd, realtime = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|p", keywords, &notify_fd, &realtime)) return -1;
    if (self->running) {
        PyErr_SetString(PyExc_RuntimeError, "Emitter already started");
        return -1;
    }
    self->notify_fd = notify_fd;
    self->blocked = calloc(MAX_FD, 1);
    if (self->blocked == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&self->cond, &attr);
    pthread_condattr_destroy(&attr);
    /* Priority inheritance: the loop's thread holds the lock for microseconds (a submit, a collect),
     * but if it is preempted meanwhile the real-time writer must not wait for it to be scheduled. */
    pthread_mutexattr_t lock_attr;
    pthread_mutexattr_init(&lock_attr);
    pthread_mutexattr_setprotocol(&lock_attr, PTHREAD_PRIO_INHERIT);
    pthread_mutex_init(&self->lock, &lock_attr);
    pthread_mutexattr_destroy(&lock_attr);
    int err = pthread_create(&self->thread, NULL, emitter_main, self);
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->running = 1;
    if (realtime) {
        struct sched_param param = {.sched_priority = sched_get_priority_min(SCHED_FIFO)};
        self->realtime = pthread_setschedparam(self->thread, SCHED_FIFO, &param) == 0;
    }
    return 0;
}

static void emitter_stop(Emitter *self) {
    if (!self->running) return;
    pthread_mutex_lock(&self->lock);
    self->stopping = 1;
    pthread_cond_signal(&self->cond);
    pthread_mutex_unlock(&self->lock);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    self->running = 0;
    for (Batch *b = self->pending, *next; b; b = next) { next = b->next; batch_free(b); }
    for (Batch *b = self->done_head, *next; b; b = next) { next = b->next; batch_free(b); }
    self->pending = self->done_head = self->done_tail = NULL;
}

static void Emitter_dealloc(Emitter *self) {
    emitter_stop(self);
    free(self->blocked);
    self->blocked = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(submit_doc,
"submit(start, fds, chunks) -> int\n\n"
"Write chunks[i] to fds[i], in order, from start (time.monotonic() seconds); returns the batch's id.");

static PyObject *Emitter_submit(Emitter *self, PyObject *args) {
    double start;
    PyObject *fds, *chunks;
    if (!PyArg_ParseTuple(args, "dO!O!", &start, &PyList_Type, &fds, &PyList_Type, &chunks)) return NULL;
    if (!self->running) {
        PyErr_SetString(PyExc_RuntimeError, "Emitter is closed");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(fds);
    if (PyList_GET_SIZE(chunks) != n) {
        PyErr_SetString(PyExc_ValueError, "fds and chunks differ in length");
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *chunk = PyList_GET_ITEM(chunks, i);
        if (!PyBytes_Check(chunk)) {
            PyErr_SetString(PyExc_TypeError, "chunks must be bytes");
            return NULL;
        }
        total += PyBytes_GET_SIZE(chunk);
    }
    Batch *b = calloc(1, sizeof(Batch));
    if (b == NULL) return PyErr_NoMemory();
    b->n = n;
    b->start = start;
    b->fds = malloc(sizeof(int) * (size_t)(n ? n : 1));
    b->offsets = malloc(sizeof(Py_ssize_t) * (size_t)(n + 1));
    b->data = malloc((size_t)(total ? total : 1));
    b->times = malloc(sizeof(double) * (size_t)(n ? n : 1));
    b->sent = malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    if (!b->fds || !b->offsets || !b->data || !b->times || !b->sent) {
        batch_free(b);
        return PyErr_NoMemory();
    }
    Py_ssize_t offset = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PyList_GET_ITEM(fds, i));
        if (fd == -1 && PyErr_Occurred()) { batch_free(b); return NULL; }
        if (fd < 0 || fd >= MAX_FD) {
            batch_free(b);
            PyErr_Format(PyExc_ValueError, "file descriptor %ld out of range", fd);
            return NULL;
        }
        b->fds[i] = (int)fd;
        PyObject *chunk = PyList_GET_ITEM(chunks, i);
        b->offsets[i] = offset;
        memcpy(b->data + offset, PyBytes_AS_STRING(chunk), (size_t)PyBytes_GET_SIZE(chunk));
        offset += PyBytes_GET_SIZE(chunk);
    }
    b->offsets[n] = offset;
    pthread_mutex_lock(&self->lock);
    b->id = self->next_id++;
    Batch **at = &self->pending;
    while (*at && (*at)->start <= start) at = &(*at)->next;
    b->next = *at;
    *at = b;
    if (self->pending == b) pthread_cond_signal(&self->cond); /* a new earliest deadline */
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromLongLong(b->id);
}

PyDoc_STRVAR(collect_doc,
"collect() -> list[tuple[int, list[float], list[int], float]]\n\n"
"The batches written since the last call, oldest first: (id, each chunk's write time, each chunk's\n"
"bytes written or -errno, when the thread took the batch up).");

static PyObject *Emitter_collect(Emitter *self, PyObject *unused) {
    pthread_mutex_lock(&self->lock);
    Batch *head = self->done_head;
    self->done_head = self->done_tail = NULL;
    pthread_mutex_unlock(&self->lock);
    PyObject *out = PyList_New(0);
    if (out == NULL) goto fail;
    for (Batch *b = head; b; b = b->next) {
        PyObject *times = PyList_New(b->n), *sent = PyList_New(b->n);
        if (times == NULL || sent == NULL) { Py_XDECREF(times); Py_XDECREF(sent); goto fail; }
        for (Py_ssize_t i = 0; i < b->n; i++) {
            PyObject *t = PyFloat_FromDouble(b->times[i]), *s = PyLong_FromSsize_t(b->sent[i]);
            if (t == NULL || s == NULL) {
                Py_XDECREF(t); Py_XDECREF(s); Py_DECREF(times); Py_DECREF(sent); goto fail;
            }
            PyList_SET_ITEM(times, i, t);
            PyList_SET_ITEM(sent, i, s);
        }
        PyObject *item = Py_BuildValue("(LNNd)", b->id, times, sent, b->woke);
        if (item == NULL || PyList_Append(out, item) < 0) { Py_XDECREF(item); goto fail; }
        Py_DECREF(item);
    }
    for (Batch *b = head, *next; b; b = next) { next = b->next; batch_free(b); }
    return out;
fail:
    for (Batch *b = head, *next; b; b = next) { next = b->next; batch_free(b); }
    Py_XDECREF(out);
    return NULL;
}

PyDoc_STRVAR(release_doc,
"release(fd)\n\nForget that writes to fd fell short: call it before closing fd, whose number may be reused.");

static PyObject *Emitter_release(Emitter *self, PyObject *arg) {
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    if (fd >= 0 && fd < MAX_FD && self->blocked) __atomic_store_n(&self->blocked[fd], 0, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(blocked_doc, "blocked(fd) -> bool\n\nWhether a write to fd fell short since its last release.");

static PyObject *Emitter_blocked(Emitter *self, PyObject *arg) {
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    int value = fd >= 0 && fd < MAX_FD && self->blocked && __atomic_load_n(&self->blocked[fd], __ATOMIC_ACQUIRE);
    return PyBool_FromLong(value);
}

static PyObject *Emitter_priority(Emitter *self, void *unused) {
    return PyUnicode_FromString(self->realtime ? "realtime" : "normal");
}

static PyGetSetDef Emitter_getset[] = {
    {"priority", (getter)Emitter_priority, NULL, "The thread's scheduling: realtime (SCHED_FIFO) or normal.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *Emitter_close(Emitter *self, PyObject *unused) {
    emitter_stop(self);
    Py_RETURN_NONE;
}

static PyMethodDef Emitter_methods[] = {
    {"submit", (PyCFunction)Emitter_submit, METH_VARARGS, submit_doc},
    {"collect", (PyCFunction)Emitter_collect, METH_NOARGS, collect_doc},
    {"release", (PyCFunction)Emitter_release, METH_O, release_doc},
    {"blocked", (PyCFunction)Emitter_blocked, METH_O, blocked_doc},
    {"close", (PyCFunction)Emitter_close, METH_NOARGS, "Stop the thread; unsent batches are dropped."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EmitterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "crossover.sim._emitter.Emitter",
    .tp_doc = PyDoc_STR("Emitter(notify_fd, realtime=False): a thread writing batches of chunks at their scheduled time."),
    .tp_basicsize = sizeof(Emitter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Emitter_init,
    .tp_dealloc = (destructor)Emitter_dealloc,
    .tp_methods = Emitter_methods,
    .tp_getset = Emitter_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_emitter", "The simulator's GIL-free token emitter thread.", -1, NULL,
};

PyMODINIT_FUNC PyInit__emitter(void) {
    if (PyType_Ready(&EmitterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&EmitterType);
    if (PyModule_AddObject(m, "Emitter", (PyObject *)&EmitterType) < 0) {
        Py_DECREF(&EmitterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
