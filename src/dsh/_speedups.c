/*
 * dsh._speedups: the read path's per-record work in C (optional; every function has a Python twin).
 *
 * Two jobs, over records `orjson` just parsed from a session log and over the text they were parsed
 * from (docs/architecture.md#read-path), plus `configure` (the classes records become and the known
 * types, set once by `dsh.session.stored`) and `learn_keys` (see there; speed only):
 *
 * - `check_records(records, start, freeze)`: the fast acceptance verdict of each record, exactly the
 *   verdicts of `dsh.session.fastcheck.fast_check` (a differential test pins it), plus each record's
 *   type as one shared string. 0 means "not certain"; the caller then runs the full rules. Whenever
 *   this code meets something it does not expect it answers 0, which is always safe. With `freeze`,
 *   each record it is certain of is handed out as an event at once, while it is still in the cache:
 *   the record (a plain dict) becomes an instance of the event type and its `data` payload, when it
 *   is a plain dict or list, an instance of the lazily frozen view types, by changing the object's
 *   type in place, without a copy. This is sound only because each of those types is a subclass of
 *   `dict` / `list` that adds no storage (`__slots__ = ()` along the whole chain, checked by
 *   `configure`), so the object's memory layout is the base type's, and because the records are
 *   fresh objects nobody else holds. A heap type's instances own a reference to their type, which
 *   is taken here. `retype_view` does the same for one child of a view when it is reached.
 * - `text_hazards(text)`: one pass over decompressed log text for the two things `orjson` would parse
 *   differently from the read rules: a run of 19 or more digits (an integer that may not fit 64
 *   bits) and a number that may parse to -0.0 (the same test as `dsh.session.stored`'s regex, never
 *   a false "no").
 *
 * Not built on free-threaded interpreters: there the Python twins run.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifdef Py_GIL_DISABLED
#error "dsh._speedups is not built for free-threaded Python; the pure-Python read path is used"
#endif

#define SAFE_INT_MAX 9007199254740991LL

static PyObject *k_type, *k_seq, *k_time, *k_data, *k_surface_op, *k_turn, *k_step, *k_chunk, *k_call_id,
    *k_name, *k_arguments, *k_provider, *k_model, *k_context_window, *k_trigger, *k_reason, *k_kind,
    *k_message, *k_id, *k_role, *k_content, *k_source, *k_usage, *k_interrupted, *k_tool_call_id,
    *k_is_error, *k_error, *k_code, *k_cached_input_tokens;
static PyObject *s_append, *s_user, *s_assistant, *s_model, *s_tool, *s_tool_result, *s_aborted, *s_error,
    *s_disposed;
static PyObject *t_turn_start, *t_turn_end, *t_step_start, *t_step_end, *t_chunk, *t_tool_call,
    *t_request_context, *t_end_seed, *t_title, *t_descriptor, *t_user_message, *t_assistant_message,
    *t_tool_result;

/* A borrowed value, or NULL when the key is missing (any lookup error is cleared: "not certain"). */
static inline PyObject *
get(PyObject *d, PyObject *key)
{
    PyObject *value = PyDict_GetItemWithError(d, key);
    if (value == NULL && PyErr_Occurred()) {
        PyErr_Clear();
    }
    return value;
}

static inline int
is_exact_str(PyObject *o)
{
    return o != NULL && PyUnicode_CheckExact(o);
}

static inline int
is_nonempty_str(PyObject *o)
{
    return is_exact_str(o) && PyUnicode_GET_LENGTH(o) > 0;
}

/* Exact str equal to `expected` (an interned ASCII constant). */
static inline int
str_is(PyObject *o, PyObject *expected)
{
    if (!is_exact_str(o)) {
        return 0;
    }
    if (o == expected) {
        return 1;
    }
    int equal = PyUnicode_Compare(o, expected) == 0;
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return equal;
}

/* An exact int (never a bool) within [lo, SAFE_INT_MAX]. */
static inline int
int_in(PyObject *o, long long lo)
{
    if (o == NULL || !PyLong_CheckExact(o)) {
        return 0;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0 || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return lo <= value && value <= SAFE_INT_MAX;
}

static inline int
seq_is(PyObject *o, Py_ssize_t index)
{
    if (o == NULL || !PyLong_CheckExact(o)) {
        return 0;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0 || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return value == (long long)index;
}

/* The envelope shared by every type: `keys` keys, `seq == index`, a safe integer `time`, and for
 * surface events `surfaceOp: "append"`. */
static inline int
envelope_ok(PyObject *r, Py_ssize_t index, Py_ssize_t keys)
{
    if (PyDict_GET_SIZE(r) != keys) {
        return 0;
    }
    if (keys == 5 && !str_is(get(r, k_surface_op), s_append)) {
        return 0;
    }
    return seq_is(get(r, k_seq), index) && int_in(get(r, k_time), -SAFE_INT_MAX);
}

static inline PyObject *
dict_at(PyObject *d, PyObject *key)
{
    PyObject *value = get(d, key);
    return value != NULL && PyDict_CheckExact(value) ? value : NULL;
}

static inline int
turn_and_step(PyObject *d)
{
    return int_in(get(d, k_turn), 0) && int_in(get(d, k_step), 0);
}

/* A message frame: non-empty id, the role, a list of typed blocks, a source with a kind. */
static int
frame_ok(PyObject *m, PyObject *role)
{
    if (m == NULL || !PyDict_CheckExact(m)) {
        return 0;
    }
    PyObject *content = get(m, k_content);
    PyObject *source = dict_at(m, k_source);
    if (!is_nonempty_str(get(m, k_id)) || !str_is(get(m, k_role), role) || content == NULL ||
        !PyList_CheckExact(content) || source == NULL || !is_nonempty_str(get(source, k_kind))) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(content); i++) {
        PyObject *block = PyList_GET_ITEM(content, i);
        if (!PyDict_CheckExact(block) || !is_nonempty_str(get(block, k_type))) {
            return 0;
        }
    }
    return 1;
}

static int
check_turn_start(PyObject *r, Py_ssize_t index)
{
    PyObject *d = dict_at(r, k_data);
    if (d == NULL || !envelope_ok(r, index, 4) || !int_in(get(d, k_turn), 0)) {
        return 0;
    }
    /* An older `turn/start` also carried `trigger`; the read pipeline migrates that shape. */
    return get(d, k_trigger) == NULL ? 1 : 0;
}

static int
check_turn_end(PyObject *r, Py_ssize_t index)
{
    PyObject *d = dict_at(r, k_data);
    if (d == NULL || !envelope_ok(r, index, 4) || !int_in(get(d, k_turn), 0)) {
        return 0;
    }
    PyObject *reason = dict_at(d, k_reason);
    if (reason == NULL) {
        return 0;
    }
    PyObject *kind = get(reason, k_kind);
    if (!is_nonempty_str(kind) || str_is(kind, s_aborted) || str_is(kind, s_error) || str_is(kind, s_disposed)) {
        return 0;
    }
    /* Any key besides `turn` and `reason` (an older log's `usage`): the read pipeline judges it. */
    return PyDict_GET_SIZE(d) == 2 ? 1 : 0;
}

static int
check_step(PyObject *r, Py_ssize_t index)
{
    PyObject *d = dict_at(r, k_data);
    return d != NULL && envelope_ok(r, index, 4) && turn_and_step(d) ? 1 : 0;
}

static int
check_chunk(PyObject *r, Py_ssize_t index)
{
    PyObject *d = dict_at(r, k_data);
    if (d == NULL || !envelope_ok(r, index, 4) || !turn_and_step(d)) {
        return 0;
    }
    PyObject *chunk = dict_at(d, k_chunk);
    if (chunk == NULL) {
        return 0;
    }
    /* A usage chunk may hold an older usage shape, which the read pipeline migrates. */
    PyObject *kind = get(chunk, k_type);
    return is_nonempty_str(kind) && !str_is(kind, k_usage) ? 1 : 0;
}

static int
check_tool_call(PyObject *r, Py_ssize_t index)
{
    PyObject *d = dict_at(r, k_data);
    if (d == NULL || !envelope_ok(r, index, 4) || !turn_and_step(d)) {
        return 0;
    }
    return is_nonempty_str(get(d, k_call_id)) && is_exact_str(get(d, k_name)) &&
                   is_exact_str(get(d, k_arguments))
               ? 1
               : 0;
}

static int
check_request_context(PyObject *r, Py_ssize_t index)
{
    PyObject *d = dict_at(r, k_data);
    if (d == NULL || !envelope_ok(r, index, 4)) {
        return 0;
    }
    PyObject *window = get(d, k_context_window);
    if (window != NULL && !int_in(window, 0)) {
        return 0;
    }
    return is_exact_str(get(d, k_provider)) && is_exact_str(get(d, k_model)) ? 1 : 0;
}

static int
check_end_seed(PyObject *r, Py_ssize_t index)
{
    return dict_at(r, k_data) != NULL && envelope_ok(r, index, 4) ? 1 : 0;
}

static int
check_opaque(PyObject *r, Py_ssize_t index)
{
    return get(r, k_data) != NULL && envelope_ok(r, index, 4) ? 1 : 0;
}

static int
check_user_message(PyObject *r, Py_ssize_t index)
{
    return envelope_ok(r, index, 5) && frame_ok(get(r, k_data), s_user) ? 2 : 0;
}

static int
check_assistant_message(PyObject *r, Py_ssize_t index)
{
    PyObject *d = dict_at(r, k_data);
    if (d == NULL || !envelope_ok(r, index, 5) || !turn_and_step(d)) {
        return 0;
    }
    PyObject *message = get(d, k_message);
    if (!frame_ok(message, s_assistant)) {
        return 0;
    }
    PyObject *source = get(message, k_source); /* a dict: frame_ok checked it */
    if (!str_is(get(source, k_kind), s_model) || !is_exact_str(get(source, k_provider)) ||
        !is_exact_str(get(source, k_model))) {
        return 0;
    }
    PyObject *usage = get(d, k_usage);
    /* An older usage shape (`cachedInputTokens`) is migrated by the read pipeline. */
    if (usage != NULL && (!PyDict_CheckExact(usage) || get(usage, k_cached_input_tokens) != NULL)) {
        return 0;
    }
    PyObject *interrupted = get(d, k_interrupted);
    return interrupted == NULL || interrupted == Py_True ? 2 : 0;
}

static int
check_tool_result(PyObject *r, Py_ssize_t index)
{
    PyObject *d = dict_at(r, k_data);
    if (d == NULL || !envelope_ok(r, index, 5) || !turn_and_step(d)) {
        return 0;
    }
    PyObject *message = get(d, k_message);
    if (!frame_ok(message, s_user)) {
        return 0;
    }
    PyObject *source = get(message, k_source);
    PyObject *call_id = get(source, k_call_id);
    PyObject *content = get(message, k_content); /* a list of dicts with a type: frame_ok checked it */
    if (!str_is(get(source, k_kind), s_tool) || !is_nonempty_str(call_id) || PyList_GET_SIZE(content) != 1) {
        return 0;
    }
    PyObject *block = PyList_GET_ITEM(content, 0);
    PyObject *inner = get(block, k_content);
    if (!str_is(get(block, k_type), s_tool_result) || !str_is(get(block, k_tool_call_id), call_id) ||
        inner == NULL || !PyList_CheckExact(inner)) {
        return 0;
    }
    PyObject *is_error = get(block, k_is_error);
    if (is_error != NULL && !PyBool_Check(is_error)) {
        return 0;
    }
    PyObject *error = get(d, k_error);
    if (error != NULL &&
        (!PyDict_CheckExact(error) || !is_exact_str(get(error, k_name)) || !is_exact_str(get(error, k_code)))) {
        return 0;
    }
    return 2;
}

static PyObject *type_codes;      /* dict: checked type -> small int code (built at import) */
/* Set by `configure`: the canonical string of every known type, and the classes records and
 * payloads become. */
static PyObject *canonical_types; /* dict: known or checked type -> (its one shared string, its code) */
static PyTypeObject *event_type, *dict_view, *list_view;

enum {
    T_UNKNOWN,
    T_TURN_START,
    T_TURN_END,
    T_STEP,
    T_CHUNK,
    T_TOOL_CALL,
    T_REQUEST_CONTEXT,
    T_END_SEED,
    T_OPAQUE,
    T_USER_MESSAGE,
    T_ASSISTANT_MESSAGE,
    T_TOOL_RESULT,
};

static int
check_one(PyObject *r, long code, Py_ssize_t index)
{
    switch (code) {
    case T_TURN_START: return check_turn_start(r, index);
    case T_TURN_END: return check_turn_end(r, index);
    case T_STEP: return check_step(r, index);
    case T_CHUNK: return check_chunk(r, index);
    case T_TOOL_CALL: return check_tool_call(r, index);
    case T_REQUEST_CONTEXT: return check_request_context(r, index);
    case T_END_SEED: return check_end_seed(r, index);
    case T_OPAQUE: return check_opaque(r, index);
    case T_USER_MESSAGE: return check_user_message(r, index);
    case T_ASSISTANT_MESSAGE: return check_assistant_message(r, index);
    case T_TOOL_RESULT: return check_tool_result(r, index);
    default: return 0;
    }
}

static void
retype(PyObject *o, PyTypeObject *type)
{
    Py_INCREF(type);
    Py_SET_TYPE(o, type);
    /* Instances of dict and list subclasses are always tracked by the collector. */
    if (!PyObject_GC_IsTracked(o)) {
        PyObject_GC_Track(o);
    }
}

/* A certain record becomes its event, its payload (a plain dict or list) the matching view. */
static void
freeze_record(PyObject *record)
{
    PyObject *data = get(record, k_data); /* present: every certain verdict read it */
    if (data != NULL && PyDict_CheckExact(data)) {
        retype(data, dict_view);
    }
    else if (data != NULL && PyList_CheckExact(data)) {
        retype(data, list_view);
    }
    retype(record, event_type);
}

static PyObject *
check_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "check_records(records: list, start: int, freeze: bool)");
        return NULL;
    }
    if (canonical_types == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "dsh._speedups.configure() was not called");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int freeze = PyObject_IsTrue(args[2]);
    if (freeze < 0) {
        return NULL;
    }
    PyObject *records = args[0];
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *verdicts = PyBytes_FromStringAndSize(NULL, n);
    PyObject *types = PyList_New(n);
    if (verdicts == NULL || types == NULL) {
        Py_XDECREF(verdicts);
        Py_XDECREF(types);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(verdicts);
    /* Records are what `orjson` parsed: dicts with str keys only, so no lookup runs Python code.
     * The list is still re-measured and each record held while it is judged. */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= PyList_GET_SIZE(records)) {
            memset(out + i, 0, (size_t)(n - i));
            for (Py_ssize_t j = i; j < n; j++) {
                PyList_SET_ITEM(types, j, Py_NewRef(Py_None));
            }
            break;
        }
        PyObject *record = Py_NewRef(PyList_GET_ITEM(records, i));
        PyObject *kind = PyDict_CheckExact(record) ? get(record, k_type) : NULL;
        int verdict = 0;
        PyObject *shared = kind;
        if (is_exact_str(kind)) {
            /* One lookup gives the shared string and the check of the type. */
            PyObject *info = PyDict_GetItemWithError(canonical_types, kind);
            if (info != NULL) {
                shared = PyTuple_GET_ITEM(info, 0);
                verdict = check_one(record, PyLong_AsLong(PyTuple_GET_ITEM(info, 1)), i + start);
            }
            else {
                PyErr_Clear();
            }
        }
        out[i] = (char)verdict;
        PyList_SET_ITEM(types, i, Py_NewRef(shared != NULL ? shared : Py_None));
        if (verdict != 0 && freeze) {
            freeze_record(record);
        }
        Py_DECREF(record);
    }
    PyObject *result = PyTuple_Pack(2, verdicts, types);
    Py_DECREF(verdicts);
    Py_DECREF(types);
    return result;
}

/* Whether `cls` is a subclass of `base` whose instances have exactly the base's layout. */
static int
same_layout(PyObject *cls, PyTypeObject *base)
{
    if (!PyType_Check(cls)) {
        return 0;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    return PyType_IsSubtype(type, base) && (type->tp_flags & Py_TPFLAGS_HEAPTYPE) &&
           type->tp_basicsize == base->tp_basicsize && type->tp_itemsize == base->tp_itemsize &&
           type->tp_dictoffset == 0 && type->tp_weaklistoffset == 0;
}

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "configure(known_types, event_type, dict_view, list_view)");
        return NULL;
    }
    if (!same_layout(args[1], &PyDict_Type) || !same_layout(args[2], &PyDict_Type) ||
        !same_layout(args[3], &PyList_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: the event and view types must add no storage to dict / list");
        return NULL;
    }
    PyObject *canonical = PyDict_New();
    PyObject *known = PySequence_Fast(args[0], "configure: known_types must be a sequence");
    if (canonical == NULL || known == NULL) {
        Py_XDECREF(canonical);
        Py_XDECREF(known);
        return NULL;
    }
    /* Every checked type first (with its code), then every other known type (code 0: not checked). */
    Py_ssize_t position = 0;
    PyObject *kind, *code;
    while (PyDict_Next(type_codes, &position, &kind, &code)) {
        PyObject *info = PyTuple_Pack(2, kind, code);
        if (info == NULL || PyDict_SetItem(canonical, kind, info) < 0) {
            Py_XDECREF(info);
            Py_DECREF(canonical);
            Py_DECREF(known);
            return NULL;
        }
        Py_DECREF(info);
    }
    PyObject *unchecked = PyLong_FromLong(T_UNKNOWN);
    for (Py_ssize_t i = 0; unchecked != NULL && i < PySequence_Fast_GET_SIZE(known); i++) {
        kind = PySequence_Fast_GET_ITEM(known, i);
        if (!PyUnicode_CheckExact(kind)) {
            PyErr_SetString(PyExc_TypeError, "configure: known_types must hold str");
            break;
        }
        PyObject *checked = PyDict_GetItemWithError(type_codes, kind);
        if (checked != NULL) {
            /* Share the caller's string for the type, keeping its code. */
            PyObject *info = PyTuple_Pack(2, kind, checked);
            int failed = info == NULL || PyDict_SetItem(canonical, kind, info) < 0;
            Py_XDECREF(info);
            if (failed) {
                break;
            }
            continue;
        }
        if (PyErr_Occurred()) {
            break;
        }
        PyObject *info = PyTuple_Pack(2, kind, unchecked);
        int failed = info == NULL || PyDict_SetItem(canonical, kind, info) < 0;
        Py_XDECREF(info);
        if (failed) {
            break;
        }
    }
    Py_XDECREF(unchecked);
    Py_DECREF(known);
    if (PyErr_Occurred()) {
        Py_DECREF(canonical);
        return NULL;
    }
    Py_XSETREF(canonical_types, canonical);
    Py_XSETREF(event_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(dict_view, (PyTypeObject *)Py_NewRef(args[2]));
    Py_XSETREF(list_view, (PyTypeObject *)Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

/* Every key constant, by address, so `learn_keys` can point it at the parser's own key object. */
static PyObject **key_slots[] = {
    &k_type, &k_seq, &k_time, &k_data, &k_surface_op, &k_turn, &k_step, &k_chunk, &k_call_id, &k_name,
    &k_arguments, &k_provider, &k_model, &k_context_window, &k_trigger, &k_reason, &k_kind, &k_message,
    &k_id, &k_role, &k_content, &k_source, &k_usage, &k_interrupted, &k_tool_call_id, &k_is_error,
    &k_error, &k_code, &k_cached_input_tokens,
};

/* `orjson` hands out one cached str object per object key it has seen recently. A dict lookup whose
 * key is that very object ends at a pointer comparison; with an equal but different object it also
 * compares the characters. Given a dict `orjson` just parsed, each key constant equal to one of its
 * keys becomes that key object. Only speed depends on this: a lookup finds equal keys either way. */
static PyObject *
learn_keys(PyObject *module, PyObject *sample)
{
    if (!PyDict_CheckExact(sample)) {
        PyErr_SetString(PyExc_TypeError, "learn_keys(sample: dict)");
        return NULL;
    }
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (PyDict_Next(sample, &position, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) {
            continue;
        }
        for (size_t i = 0; i < sizeof(key_slots) / sizeof(key_slots[0]); i++) {
            PyObject **slot = key_slots[i];
            if (*slot != key && PyUnicode_Compare(*slot, key) == 0) {
                Py_SETREF(*slot, Py_NewRef(key));
            }
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
retype_view(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "retype_view(value, dict_view, list_view)");
        return NULL;
    }
    PyObject *value = args[0];
    if (!same_layout(args[1], &PyDict_Type) || !same_layout(args[2], &PyList_Type)) {
        PyErr_SetString(PyExc_TypeError, "retype_view: the view types must add no storage to dict / list");
        return NULL;
    }
    if (PyDict_CheckExact(value)) {
        retype(value, (PyTypeObject *)args[1]);
    }
    else if (PyList_CheckExact(value)) {
        retype(value, (PyTypeObject *)args[2]);
    }
    return Py_NewRef(value);
}

#define HAZARD_LONG_DIGITS 1
#define HAZARD_NEGATIVE_ZERO 2
#define LONG_RUN 19

static inline int
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* Whether a run of at least LONG_RUN digits occurs in text[0:n]. Probes every LONG_RUN-th byte:
 * any such run covers one of the probed positions, and a probe on a non-digit skips a whole window. */
static int
has_long_digit_run(const unsigned char *text, Py_ssize_t n)
{
    Py_ssize_t floor = 0; /* no run of interest starts before this */
    Py_ssize_t i = LONG_RUN - 1;
    while (i < n) {
        if (!is_digit(text[i])) {
            floor = i + 1;
            i += LONG_RUN;
            continue;
        }
        Py_ssize_t first = i;
        while (first > floor && is_digit(text[first - 1])) {
            first--;
        }
        Py_ssize_t end = i + 1;
        while (end < n && is_digit(text[end]) && end - first < LONG_RUN) {
            end++;
        }
        if (end - first >= LONG_RUN) {
            return 1;
        }
        /* text[end] is not a digit (or the text ended): the next run starts after it. */
        floor = end + 1;
        i = end + LONG_RUN;
    }
    return 0;
}

/* Whether some '-' starts `-0` not followed by a digit or `.[1-9]`, or `-digits[.digits][eE]-`. */
static int
may_hold_negative_zero(const unsigned char *text, Py_ssize_t n)
{
    const unsigned char *end = text + n;
    const unsigned char *p = text;
    while ((p = memchr(p, '-', (size_t)(end - p))) != NULL) {
        const unsigned char *q = p + 1;
        if (q < end && *q == '0') {
            const unsigned char *r = q + 1;
            int digit_follows = r < end && is_digit(*r);
            int fraction_follows = r + 1 < end && *r == '.' && *(r + 1) >= '1' && *(r + 1) <= '9';
            if (!digit_follows && !fraction_follows) {
                return 1;
            }
        }
        const unsigned char *r = q;
        while (r < end && is_digit(*r)) {
            r++;
        }
        if (r > q) {
            if (r + 1 < end && *r == '.' && is_digit(*(r + 1))) {
                r++;
                while (r < end && is_digit(*r)) {
                    r++;
                }
            }
            if (r + 1 < end && (*r == 'e' || *r == 'E') && *(r + 1) == '-') {
                return 1;
            }
        }
        p = q;
        if (p >= end) {
            break;
        }
    }
    return 0;
}

static PyObject *
text_hazards(PyObject *module, PyObject *text)
{
    Py_buffer view;
    if (PyObject_GetBuffer(text, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *bytes = (const unsigned char *)view.buf;
    long flags = 0;
    Py_BEGIN_ALLOW_THREADS
    if (has_long_digit_run(bytes, view.len)) {
        flags |= HAZARD_LONG_DIGITS;
    }
    if (may_hold_negative_zero(bytes, view.len)) {
        flags |= HAZARD_NEGATIVE_ZERO;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromLong(flags);
}

static PyMethodDef methods[] = {
    {"text_hazards", (PyCFunction)text_hazards, METH_O,
     "text_hazards(text) -> int: 1 = a run of 19+ digits, 2 = a number that may parse to -0.0 (bit flags)."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(known_types, event_type, dict_view, list_view): what check_records shares and freezes into."},
    {"check_records", (PyCFunction)(void (*)(void))check_records, METH_FASTCALL,
     "check_records(records, start, freeze) -> (verdicts, types): fast-check verdicts (0 = not certain), the\n"
     "shared type string of each record, and with freeze each certain record turned into its event."},
    {"learn_keys", (PyCFunction)learn_keys, METH_O,
     "learn_keys(sample): use the key objects of a dict orjson just parsed for the lookups (speed only)."},
    {"retype_view", (PyCFunction)(void (*)(void))retype_view, METH_FASTCALL,
     "retype_view(value, dict_view, list_view): a fresh plain dict or list turned into its view in place."},
    {NULL, NULL, 0, NULL},
};

static int
intern_all(void)
{
#define INTERN(var, text)                                                                                          \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return -1;
    INTERN(k_type, "type") INTERN(k_seq, "seq") INTERN(k_time, "time") INTERN(k_data, "data")
    INTERN(k_surface_op, "surfaceOp") INTERN(k_turn, "turn") INTERN(k_step, "step") INTERN(k_chunk, "chunk")
    INTERN(k_call_id, "callId") INTERN(k_name, "name") INTERN(k_arguments, "arguments")
    INTERN(k_provider, "provider") INTERN(k_model, "model") INTERN(k_context_window, "contextWindow")
    INTERN(k_trigger, "trigger") INTERN(k_reason, "reason") INTERN(k_kind, "kind") INTERN(k_message, "message")
    INTERN(k_id, "id") INTERN(k_role, "role") INTERN(k_content, "content") INTERN(k_source, "source")
    INTERN(k_usage, "usage") INTERN(k_interrupted, "interrupted") INTERN(k_tool_call_id, "toolCallId")
    INTERN(k_is_error, "isError") INTERN(k_error, "error") INTERN(k_code, "code")
    INTERN(k_cached_input_tokens, "cachedInputTokens")
    INTERN(s_append, "append") INTERN(s_user, "user") INTERN(s_assistant, "assistant") INTERN(s_model, "model")
    INTERN(s_tool, "tool") INTERN(s_tool_result, "tool-result") INTERN(s_aborted, "aborted")
    INTERN(s_error, "error") INTERN(s_disposed, "disposed")
    INTERN(t_turn_start, "turn/start") INTERN(t_turn_end, "turn/end") INTERN(t_step_start, "step/start")
    INTERN(t_step_end, "step/end") INTERN(t_chunk, "assistant/chunk") INTERN(t_tool_call, "tool/call")
    INTERN(t_request_context, "request/context") INTERN(t_end_seed, "session/end-seed")
    INTERN(t_title, "session/title") INTERN(t_descriptor, "subagent/descriptor")
    INTERN(t_user_message, "user/message") INTERN(t_assistant_message, "assistant/message")
    INTERN(t_tool_result, "tool/result")
#undef INTERN
    struct {
        PyObject *kind;
        long code;
    } table[] = {
        {t_turn_start, T_TURN_START}, {t_turn_end, T_TURN_END}, {t_step_start, T_STEP}, {t_step_end, T_STEP},
        {t_chunk, T_CHUNK}, {t_tool_call, T_TOOL_CALL}, {t_request_context, T_REQUEST_CONTEXT},
        {t_end_seed, T_END_SEED}, {t_title, T_OPAQUE}, {t_descriptor, T_OPAQUE},
        {t_user_message, T_USER_MESSAGE}, {t_assistant_message, T_ASSISTANT_MESSAGE},
        {t_tool_result, T_TOOL_RESULT},
    };
    if ((type_codes = PyDict_New()) == NULL) {
        return -1;
    }
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        PyObject *code = PyLong_FromLong(table[i].code);
        if (code == NULL || PyDict_SetItem(type_codes, table[i].kind, code) < 0) {
            Py_XDECREF(code);
            return -1;
        }
        Py_DECREF(code);
    }
    return 0;
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "dsh._speedups", "The read path's per-record work in C (see the file's header).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (intern_all() < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    PyObject *safe_max = PyLong_FromLongLong(SAFE_INT_MAX);
    if (safe_max == NULL || PyModule_AddObject(module, "SAFE_INT_MAX", safe_max) < 0) {
        Py_XDECREF(safe_max);
        Py_DECREF(module);
        return NULL;
    }
    PyObject *keys = PyTuple_New(sizeof(key_slots) / sizeof(key_slots[0]));
    if (keys == NULL) {
        Py_DECREF(module);
        return NULL;
    }
    for (size_t i = 0; i < sizeof(key_slots) / sizeof(key_slots[0]); i++) {
        PyTuple_SET_ITEM(keys, i, Py_NewRef(*key_slots[i]));
    }
    if (PyModule_AddObject(module, "KEYS", keys) < 0) {
        Py_DECREF(keys);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "HAZARD_LONG_DIGITS", HAZARD_LONG_DIGITS) < 0 ||
        PyModule_AddIntConstant(module, "HAZARD_NEGATIVE_ZERO", HAZARD_NEGATIVE_ZERO) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
