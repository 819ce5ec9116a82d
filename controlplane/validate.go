package controlplane

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The store keeps times as Unix nanoseconds: a time outside these bounds
// would wrap around (a heartbeat's "since" read back as 1754).
var (
	minTime = time.Unix(0, 0).UTC()
	maxTime = time.Date(2262, 1, 1, 0, 0, 0, 0, time.UTC)
)

var (
	timeType = reflect.TypeFor[time.Time]()
	byteType = reflect.TypeFor[byte]()
)

// checkFields refuses what no store can keep and no retry would fix: a
// NUL character (U+0000) or bytes that are not UTF-8 in any string or raw
// JSON the request carries (PostgreSQL's text refuses both, so the answer
// would be a 503 "try again" that never succeeds), and a time the store
// cannot record. It walks every field of v, so a new request field is
// covered without a line here. The refusal names the field (its JSON
// path), never its value.
func checkFields(v reflect.Value, name string) *apiError {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return checkFields(v.Elem(), name)
	case reflect.String:
		return checkText(v.String(), name)
	case reflect.Slice:
		if v.Type().Elem() == byteType { // json.RawMessage
			return checkRaw(v.Bytes(), name)
		}
		for i := range v.Len() {
			if e := checkFields(v.Index(i), name+"["+strconv.Itoa(i)+"]"); e != nil {
				return e
			}
		}
	case reflect.Struct:
		if v.Type() == timeType {
			t := v.Interface().(time.Time)
			if !t.IsZero() && (t.Before(minTime) || !t.Before(maxTime)) {
				return invalid("%s must be a time between 1970 and 2262.", name)
			}
			return nil
		}
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			field := name
			if !f.Anonymous {
				field = joinField(name, jsonName(f))
			}
			if e := checkFields(v.Field(i), field); e != nil {
				return e
			}
		}
	}
	return nil
}

func checkText(s, name string) *apiError {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return invalid("%s must not hold a NUL character (U+0000).", name)
	case !utf8.ValidString(s):
		return invalid("%s must be UTF-8 text.", name)
	}
	return nil
}

// checkRaw is checkText for raw JSON, whose strings may also spell a NUL
// as an escape (\u0000), which a reader of the stored text would decode.
func checkRaw(raw []byte, name string) *apiError {
	if e := checkText(string(raw), name); e != nil || !bytes.Contains(raw, []byte(`\u0000`)) {
		return e
	}
	var x any
	if err := json.Unmarshal(raw, &x); err != nil {
		return errBadJSON
	}
	if holdsNUL(x) {
		return invalid("%s must not hold a NUL character (U+0000).", name)
	}
	return nil
}

func holdsNUL(x any) bool {
	switch x := x.(type) {
	case string:
		return strings.IndexByte(x, 0) >= 0
	case []any:
		for _, e := range x {
			if holdsNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if strings.IndexByte(k, 0) >= 0 || holdsNUL(e) {
				return true
			}
		}
	}
	return false
}

func jsonName(f reflect.StructField) string {
	if n, _, _ := strings.Cut(f.Tag.Get("json"), ","); n != "" {
		return n
	}
	return f.Name
}

func joinField(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// checkRequired refuses an object that lacks one of the named top-level
// keys. encoding/json matches keys without regard to case, so this does too.
func checkRequired(raw []byte, required []string) *apiError {
	if len(required) == 0 {
		return nil
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return errBadJSON
	}
	var missing []string
	for _, want := range required {
		found := false
		for k := range keys {
			if strings.EqualFold(k, want) {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		return invalid("%s required.", plural(missing))
	}
	return nil
}

// plural words "a is", "a and b are", "a, b and c are".
func plural(names []string) string {
	if len(names) == 1 {
		return names[0] + " is"
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1] + " are"
}

// pathError refuses a request path that routing would otherwise redirect
// (307 with no body) or that no store could keep: one with ".", ".." or
// "//" segments, a NUL character, or bytes that are not UTF-8.
func pathError(p string) *apiError {
	if e := checkText(p, "the request path"); e != nil {
		return e
	}
	if p == "" || p[0] != '/' {
		return nil // "*" and the like: routing answers them
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	if clean != p {
		return invalid("The request path must be canonical: no '.', '..' or empty segment.")
	}
	return nil
}

// checkPaths wraps h with pathError.
func checkPaths(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := pathError(r.URL.Path); e != nil {
			writeError(w, e)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// isObject reports whether raw JSON is an object (not null, an array, …).
func isObject(raw []byte) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) > 0 && raw[0] == '{'
}
