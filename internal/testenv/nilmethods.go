package testenv

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

// NilMethods calls every exported method of each handle, a typed nil pointer
// ((*T)(nil)), with zero arguments (the variadic ones left out), and fails the test
// if one panics or does not return within 5 s: the handle a failed call returns is
// nil, and a method added to a handle type without a nil guard fails here.
func NilMethods(t *testing.T, handles ...any) {
	t.Helper()
	for _, h := range handles {
		typ := reflect.TypeOf(h)
		if typ == nil || typ.Kind() != reflect.Pointer || !reflect.ValueOf(h).IsNil() {
			t.Fatalf("NilMethods takes typed nil pointers, got %#v", h)
		}
		if typ.NumMethod() == 0 {
			t.Fatalf("%v has no exported methods", typ)
		}
		for i := 0; i < typ.NumMethod(); i++ {
			m := typ.Method(i)
			t.Run(typ.Elem().Name()+"."+m.Name, func(t *testing.T) {
				if err := callZero(reflect.Zero(typ), m); err != "" {
					t.Fatalf("(%v)(nil).%s %s", typ, m.Name, err)
				}
			})
		}
	}
}

// ZeroArgs calls every exported method of each live handle with zero arguments (nil
// slices, nil pointers, nil contexts, zero numbers; the variadic ones left out), except
// the methods named in skip, and fails the test if one panics or does not return
// within 5 s: bad input gets an error at the call. Run it on open handles and again
// once they are closed.
func ZeroArgs(t *testing.T, skip map[string]bool, handles ...any) {
	t.Helper()
	eachMethod(t, "ZeroArgs", skip, handles, func(h reflect.Value, m reflect.Method) {
		if err := callZero(h, m); err != "" {
			t.Errorf("(%v).%s with zero arguments %s", h.Type(), m.Name, err)
		}
	})
}

// ExtremeArgs is ZeroArgs with, in turn, each integer argument of a method at an
// extreme (-1 and the type's minimum and maximum, or the unsigned maximum and its
// top bit) and the others zero: a length, count, index, id, tag, address or duration
// that UCX, CUDA or an allocation would take as given fails the test by panicking, by
// hanging, or by crashing the process.
func ExtremeArgs(t *testing.T, skip map[string]bool, handles ...any) {
	t.Helper()
	eachMethod(t, "ExtremeArgs", skip, handles, func(h reflect.Value, m reflect.Method) {
		ft := m.Func.Type()
		for j := 1; j < ft.NumIn(); j++ {
			if ft.IsVariadic() && j == ft.NumIn()-1 {
				break
			}
			for _, v := range extremes(ft.In(j)) {
				if err := callWith(h, m, j, v); err != "" {
					t.Errorf("(%v).%s with argument %d = %v %s", h.Type(), m.Name, j, v, err)
				}
			}
		}
	})
}

// eachMethod calls f with every exported method of each handle (non-nil pointers)
// but those named in skip.
func eachMethod(t *testing.T, name string, skip map[string]bool, handles []any, f func(h reflect.Value, m reflect.Method)) {
	t.Helper()
	for _, h := range handles {
		typ := reflect.TypeOf(h)
		if typ == nil || typ.Kind() != reflect.Pointer || reflect.ValueOf(h).IsNil() {
			t.Fatalf("%s takes non-nil pointers, got %#v", name, h)
		}
		for i := 0; i < typ.NumMethod(); i++ {
			if m := typ.Method(i); !skip[m.Name] {
				f(reflect.ValueOf(h), m)
			}
		}
	}
}

// extremes are the values ExtremeArgs tries for an argument of type typ (none for
// what is not an integer).
func extremes(typ reflect.Type) []reflect.Value {
	var vs []reflect.Value
	switch typ.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		bits := typ.Bits()
		for _, x := range []int64{-1, -1 << (bits - 1), 1<<(bits-1) - 1} {
			v := reflect.New(typ).Elem()
			v.SetInt(x)
			vs = append(vs, v)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		bits := typ.Bits()
		for _, x := range []uint64{^uint64(0) >> (64 - bits), 1 << (bits - 1)} {
			v := reflect.New(typ).Elem()
			v.SetUint(x)
			vs = append(vs, v)
		}
	}
	return vs
}

// callZero calls m on recv with zero arguments; it says what went wrong ("" if
// nothing): a panic, or no return within 5 s.
func callZero(recv reflect.Value, m reflect.Method) string {
	return callWith(recv, m, -1, reflect.Value{})
}

// callWith is callZero with argument j (counting the receiver as 0) set to v; j < 0
// sets none.
func callWith(recv reflect.Value, m reflect.Method, j int, v reflect.Value) string {
	ft := m.Func.Type()
	nin := ft.NumIn()
	if ft.IsVariadic() {
		nin--
	}
	args := []reflect.Value{recv}
	for k := 1; k < nin; k++ {
		if k == j {
			args = append(args, v)
			continue
		}
		args = append(args, reflect.Zero(ft.In(k)))
	}
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		m.Func.Call(args)
	}()
	select {
	case p := <-done:
		if p != nil {
			return fmt.Sprintf("panicked: %v", p)
		}
		return ""
	case <-time.After(5 * time.Second):
		return "did not return within 5s"
	}
}
