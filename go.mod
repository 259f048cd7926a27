module github.com/ucpx/ucpx

go 1.24
