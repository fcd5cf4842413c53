total = 10
