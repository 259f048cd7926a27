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
	for _, h := range handles {
		typ := reflect.TypeOf(h)
		if typ == nil || typ.Kind() != reflect.Pointer || reflect.ValueOf(h).IsNil() {
			t.Fatalf("ZeroArgs takes non-nil pointers, got %#v", h)
		}
		for i := 0; i < typ.NumMethod(); i++ {
			m := typ.Method(i)
			if skip[m.Name] {
				continue
			}
			if err := callZero(reflect.ValueOf(h), m); err != "" {
				t.Errorf("(%v).%s with zero arguments %s", typ, m.Name, err)
			}
		}
	}
}

// callZero calls m on recv with zero arguments; it says what went wrong ("" if
// nothing): a panic, or no return within 5 s.
func callZero(recv reflect.Value, m reflect.Method) string {
	ft := m.Func.Type()
	nin := ft.NumIn()
	if ft.IsVariadic() {
		nin--
	}
	args := []reflect.Value{recv}
	for j := 1; j < nin; j++ {
		args = append(args, reflect.Zero(ft.In(j)))
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
