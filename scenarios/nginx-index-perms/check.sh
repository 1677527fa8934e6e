expect_page "home page served" http://127.0.0.1/ "News"
finish
