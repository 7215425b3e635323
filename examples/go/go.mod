module example.com/mqgw-examples

go 1.18
