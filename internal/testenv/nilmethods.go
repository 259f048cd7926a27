package testenv

import (
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
				ft := m.Func.Type()
				nin := ft.NumIn()
				if ft.IsVariadic() {
					nin--
				}
				args := []reflect.Value{reflect.Zero(typ)}
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
						t.Fatalf("(%v)(nil).%s panicked: %v", typ, m.Name, p)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("(%v)(nil).%s did not return within 5s", typ, m.Name)
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
		recv := reflect.ValueOf(h)
		for i := 0; i < typ.NumMethod(); i++ {
			m := typ.Method(i)
			if skip[m.Name] {
				continue
			}
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
					t.Errorf("(%v).%s with zero arguments panicked: %v", typ, m.Name, p)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("(%v).%s with zero arguments did not return within 5s", typ, m.Name)
			}
		}
	}
}
